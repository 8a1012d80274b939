"""fp32 against bf16 on this CPU: the engine's speed in each, and how far bf16 moves its numbers.

    python bench/dtype.py [--tokens 64] [--rounds 3]

``MILLM_DTYPE=auto`` loads fp32 on the CPU; ``MILLM_DTYPE=bfloat16`` is the faster choice on a CPU that
multiplies bf16 in hardware (AVX512-BF16 or AMX-BF16), at a price this measures. It loads the bundled model in
both dtypes in one process and runs, rounds interleaved, medians reported:
- one greedy answer of ``--tokens`` tokens (tokens/s);
- eight sampled answers in one batch (tokens/s), as a sweep's or ``millm batch``'s rows are;
- 32 echo-scored texts (texts/s), as a sweep scores fluency.
Then what bf16 changes: how much of the greedy answer agrees with fp32's, and the mean absolute difference of
the echoed per-token log-probabilities (nats).
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
from millm.engine.params import GenerationRequest, TextPrompt
from millm.engine.scoring import ScoreRequest, ScoreRow, ScoringParams
from millm.registry import resolve
from millm.requests.validation import sampling_params

PROMPT = "Once upon a time, in a village by the sea, there lived"
ANSWER = " an old fisherman who knew every wave by name. Each morning he rowed out before the sun rose."


def greedy(engine: Engine, tokens: int) -> tuple[int, str]:
    request = GenerationRequest([TextPrompt(PROMPT)], sampling_params({"temperature": 0, "max_tokens": tokens}))
    events = list(engine.generate(request))
    usage = next(e for e in events if isinstance(e, Usage))
    return usage.completion_tokens, "".join(e.text for e in events if isinstance(e, Delta))


def sampled(engine: Engine, tokens: int) -> int:
    request = GenerationRequest([TextPrompt(PROMPT)],
                               sampling_params({"temperature": 1, "max_tokens": tokens, "n": 8, "seed": 0}))
    return next(e for e in engine.generate(request) if isinstance(e, Usage)).completion_tokens


def echoed(engine: Engine, texts: int) -> list[list[float]]:
    params = ScoringParams(allowed=None, temperature=1.0, top_n=0, report=True, echo=True, next_token=False)
    rows = [ScoreRow(TextPrompt(f"{i}. {PROMPT}{ANSWER}"), params) for i in range(texts)]
    return [[t.logprob for t in r.echo or [] if t.logprob is not None] for r in engine.score(ScoreRequest(rows))]


def timed(run: Callable[[Engine], int], engine: Engine) -> float:
    start = time.perf_counter()
    n = run(engine)
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    settings = get_settings()
    entry = resolve(settings.default_model, settings)
    engines = {name: load_engine(entry, settings.model_copy(update={"dtype": name}))
               for name in ("float32", "bfloat16")}
    jobs: dict[str, Callable[[Engine], int]] = {
        "greedy": lambda e: greedy(e, args.tokens)[0],
        "8 sampled": lambda e: sampled(e, args.tokens),
        "32 echo scores": lambda e: len(echoed(e, 32)),
    }
    rates: dict[tuple[str, str], list[float]] = {}
    for engine in engines.values():  # warm up
        greedy(engine, 4)
    for _ in range(args.rounds):
        for job, run in jobs.items():
            for name, engine in engines.items():
                rates.setdefault((job, name), []).append(timed(run, engine))
    print(f"{entry.id} on the CPU, {torch.get_num_threads()} threads, {args.rounds} rounds (medians)")
    for job in jobs:
        fp32, bf16 = (statistics.median(rates[job, name]) for name in engines)
        unit = "texts/s" if "echo" in job else "tokens/s"
        print(f"{job:16} fp32 {fp32:8.1f}  bf16 {bf16:8.1f} {unit:8}  bf16/fp32 {bf16 / fp32:5.2f}x")
    texts = {name: greedy(engine, args.tokens)[1] for name, engine in engines.items()}
    fp32_text, bf16_text = texts.values()
    same = next((i for i, (a, b) in enumerate(zip(fp32_text, bf16_text)) if a != b), len(fp32_text))
    logprobs = {name: echoed(engine, 1)[0] for name, engine in engines.items()}
    gap = statistics.mean(abs(a - b) for a, b in zip(*logprobs.values(), strict=True))
    print(f"greedy answers identical for their first {same} of {len(fp32_text)} characters")
    print(f"fp32: {fp32_text!r}\nbf16: {bf16_text!r}")
    print(f"echoed log-prob difference: {gap:.4f} nats/token (mean absolute)")


if __name__ == "__main__":
    main()
