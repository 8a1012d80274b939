"""Echo scoring throughput (lm-eval's loglikelihood): miLLM's padded batches vs a naive HF loop.

    python bench/echo_score.py [--pairs 256] [--batch-size 32]

Both compute, for each (context, continuation) pair, the continuation's summed log-probability on the
bundled model. The naive loop is what an evaluation script without miLLM does (one forward per pair);
miLLM answers the same rows as one /v1/completions echo request would (token-id prompts, logprobs 1,
max_tokens 1). Prints rows/s of both, the ratio, and the largest difference between their sums.
"""

from __future__ import annotations

import argparse
import time

import torch

from millm.config import get_settings
from millm.engine import load_engine
from millm.registry import resolve
from millm.requests.builder import build_completion

SUBJECTS = ["apple", "carrot", "stone", "whale", "cloud", "violin", "pepper", "glacier"]
CONTEXTS = ["Question: What colour is a {}?\nAnswer:", "The {} was found near the", "A {} is usually"]
CONTINUATIONS = [" red", " green and round", " the river bank", " very large indeed"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    settings = get_settings()
    engine = load_engine(resolve(settings.default_model, settings), settings)
    tok, model = engine.tokenizer, engine.model  # type: ignore[attr-defined]
    pairs = []
    for i in range(args.pairs):
        context = CONTEXTS[i % len(CONTEXTS)].format(SUBJECTS[i % len(SUBJECTS)] + f" #{i}")
        pairs.append((tok(context)["input_ids"], tok(CONTINUATIONS[i % len(CONTINUATIONS)],
                                                     add_special_tokens=False)["input_ids"]))

    def naive() -> list[float]:
        sums = []
        with torch.inference_mode():
            for context, continuation in pairs:
                logits = model(torch.tensor([context + continuation])).logits[0].double().log_softmax(-1)
                sums.append(sum(float(logits[len(context) - 1 + j, t]) for j, t in enumerate(continuation)))
        return sums

    def ours() -> list[float]:
        body = {"model": engine.model_id, "prompt": [c + k for c, k in pairs], "max_tokens": 1, "logprobs": 1,
                "echo": True, "temperature": 0}
        built = build_completion(body, lambda _: "transformers")
        assert built.score is not None
        request = built.score.__class__(built.score.rows, batch_size=args.batch_size)
        results = engine.score(request)
        return [sum(p.logprob or 0.0 for p in r.echo[len(c):]) for r, (c, _) in zip(results, pairs)
                if r.echo is not None]

    naive(), ours()  # warm up
    start = time.perf_counter()
    base = naive()
    naive_rate = args.pairs / (time.perf_counter() - start)
    start = time.perf_counter()
    mine = ours()
    our_rate = args.pairs / (time.perf_counter() - start)
    print(f"{engine.model_id}, {args.pairs} (context, continuation) pairs, {torch.get_num_threads()} threads")
    print(f"naive HF loop, one pair at a time:     {naive_rate:7.1f} rows/s")
    print(f"miLLM echo scoring, batch {args.batch_size:<3}:        {our_rate:7.1f} rows/s")
    print(f"speed-up: {our_rate / naive_rate:.2f}x; largest |difference| of the sums: "
          f"{max(abs(a - b) for a, b in zip(base, mine)):.2e}")


if __name__ == "__main__":
    main()
