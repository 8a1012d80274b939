"""int8 weights (``MILLM_WEIGHTS=int8``) against fp32: batch-1 greedy decode on the transformers engine, beside
``model.generate`` in fp32 and raw llama-cpp-python on the bundled Q4_1 GGUF file, in one run.

    python bench/int8.py [--tokens 128] [--rounds 3]
    python bench/int8.py --quality [--windows 64]     # what int8 costs in quality, no timing


Loads the bundled model three times in this process: the transformers engine with fp32 weights (its linear layers
packed for oneDNN, the default), the transformers engine with int8 weights, and the GGUF file on llama.cpp
(whose ``Llama`` is called directly: raw llama-cpp-python). Rounds are interleaved, medians reported:
- miLLM fp32 and miLLM int8: ``engine.generate`` with one greedy prompt of ``--tokens`` tokens;
- ``generate`` fp32 (stock): ``model.generate`` (greedy, the same prompt ids) on the model as plain transformers
  loads it (``AutoModelForCausalLM.from_pretrained`` of the same weights, fp32, ``nn.Linear`` layers): what a user of
  plain transformers runs, the issue's baseline;
- ``generate`` fp32 (miLLM model): the same on the fp32 engine's own model (fused, packed for oneDNN), the
  baseline of ``bench/decode.py``: what is left of the step outside the products;
- llama.cpp Q4_1: ``Llama.create_completion`` with the same prompt, greedy, no repeat penalty.
Then the ratios the issue names, and how much of int8's greedy answer agrees with fp32's.

``--quality`` loads fp32 and int8 only and measures, with no timing: perplexity on held-out text the default SAE
corpus ships with every install (``millm.sae.training.corpus.python_documentation``, the documents
``split_documents`` holds out at 10%, seed 0, in windows of 256 tokens), fp32 against int8 on the same windows,
the mean per-window difference in nats/token with its standard error; and the mean absolute difference of the
per-token log-probabilities (what echo scoring reports).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from millm.config import get_settings
from millm.engine import load_engine
from millm.engine.base import Engine
from millm.engine.events import Delta, Usage
from millm.engine.loader import load_weights
from millm.engine.params import GenerationRequest, TextPrompt
from millm.registry import BUNDLED_ID, resolve
from millm.requests.validation import sampling_params

PROMPT = "Once upon a time, in a village by the sea, there lived"
GGUF = "SmolLM2-135M-Instruct:Q4_1"


def greedy(engine: Engine, tokens: int) -> tuple[int, str]:
    request = GenerationRequest([TextPrompt(PROMPT)], sampling_params({"temperature": 0, "max_tokens": tokens}))
    events = list(engine.generate(request))
    usage = next(e for e in events if isinstance(e, Usage))
    return usage.completion_tokens, "".join(e.text for e in events if isinstance(e, Delta))


def window_logprobs(engine: Engine, windows: torch.Tensor) -> torch.Tensor:
    """Per window, each next token's log-probability (fp32), 8 windows a forward."""
    model = engine.model  # type: ignore[attr-defined]
    out = []
    with torch.inference_mode():
        for batch in windows.split(8):
            logits = model(input_ids=batch).logits[:, :-1].float()
            out.append(torch.log_softmax(logits, -1).gather(-1, batch[:, 1:, None])[..., 0])
    return torch.cat(out)


def quality(fp32: Engine, int8: Engine, windows: int) -> None:
    from millm.sae.training.corpus import python_documentation, split_documents, token_windows

    _, held_out = split_documents(python_documentation(), 0.1, 0)
    ids = token_windows(fp32.tokenizer, held_out, 256, windows)  # type: ignore[attr-defined]
    a, b = window_logprobs(fp32, ids), window_logprobs(int8, ids)
    nll_a, nll_b = -a.mean(1), -b.mean(1)
    diff = nll_b - nll_a
    se = float(diff.std() / len(diff) ** 0.5)
    print(f"held-out Python documentation: {ids.shape[0]} windows of {ids.shape[1]} tokens ({ids.numel()} tokens)")
    print(f"perplexity fp32 {float(nll_a.mean().exp()):.3f}  int8 {float(nll_b.mean().exp()):.3f}  "
          f"(int8/fp32 {float((nll_b.mean() - nll_a.mean()).exp()):.4f})")
    print(f"int8 - fp32: {float(diff.mean()):+.4f} nats/token, standard error {se:.4f} over windows; "
          f"windows where int8 is worse: {int((diff > 0).sum())} of {len(diff)}")
    print(f"per-token log-prob, mean absolute difference: {float((a - b).abs().mean()):.4f} nats "
          f"(largest {float((a - b).abs().max()):.3f})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quality", action="store_true", help="measure what int8 costs in quality instead")
    parser.add_argument("--windows", type=int, default=64, help="--quality: held-out windows of 256 tokens")
    args = parser.parse_args()
    settings = get_settings()
    entry = resolve(BUNDLED_ID, settings)
    if args.quality:
        engines = [load_engine(entry, settings.model_copy(update={"weights": w})) for w in ("dtype", "int8")]
        quality(engines[0], engines[1], args.windows)
        return
    fp32 = load_engine(entry, settings.model_copy(update={"weights": "dtype"}))
    int8 = load_engine(entry, settings.model_copy(update={"weights": "int8"}))
    llama = load_engine(resolve(GGUF, settings), settings.model_copy(update={"weights": "auto"}))
    llm = llama.llm  # type: ignore[attr-defined]
    model, tok = fp32.model, fp32.tokenizer  # type: ignore[attr-defined]
    stock = load_weights(entry, settings, torch.float32)[0].eval()
    ids = torch.tensor([fp32.tokenize(TextPrompt(PROMPT))])

    def generating(on: torch.nn.Module) -> Callable[[], int]:
        def run() -> int:
            with torch.inference_mode():
                out = on.generate(ids, max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False,  # type: ignore[operator]
                                  pad_token_id=tok.pad_token_id)
            return int(out.shape[1] - ids.shape[1])
        return run

    def run_llama() -> int:
        out = llm.create_completion(PROMPT, max_tokens=args.tokens, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0,
                                    repeat_penalty=1.0)
        return int(out["usage"]["completion_tokens"])

    runs: dict[str, Callable[[], int]] = {
        "miLLM fp32": lambda: greedy(fp32, args.tokens)[0],
        "miLLM int8": lambda: greedy(int8, args.tokens)[0],
        "generate fp32 (stock)": generating(stock),
        "generate fp32 (miLLM model)": generating(model),
        "llama.cpp Q4_1": run_llama,
    }
    for run in runs.values():  # warm up
        run()
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            n = run()
            rates[name].append(n / (time.perf_counter() - start))
    m = {name: statistics.median(r) for name, r in rates.items()}
    print(f"{entry.id}, batch 1, {args.tokens} greedy tokens, {torch.get_num_threads()} threads, "
          f"medians of {args.rounds} interleaved rounds")
    for name, rate in m.items():
        print(f"{name:30} {rate:8.1f} tok/s   ({', '.join(f'{r:.1f}' for r in rates[name])})")
    print(f"miLLM int8 / llama.cpp Q4_1: {m['miLLM int8'] / m['llama.cpp Q4_1']:5.2f}x")
    print(f"miLLM fp32 / generate fp32 (stock): {m['miLLM fp32'] / m['generate fp32 (stock)']:5.2f}x")
    print(f"miLLM fp32 / generate fp32 (miLLM model): {m['miLLM fp32'] / m['generate fp32 (miLLM model)']:5.2f}x")
    print(f"miLLM int8 / miLLM fp32:     {m['miLLM int8'] / m['miLLM fp32']:5.2f}x")
    a, b = greedy(fp32, args.tokens)[1], greedy(int8, args.tokens)[1]
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    print(f"int8's greedy answer agrees with fp32's for its first {same} of {len(a)} characters")
    print(f"fp32: {a[:120]!r}\nint8: {b[:120]!r}")


if __name__ == "__main__":
    main()
