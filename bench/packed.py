"""Linear layers packed for oneDNN against plain ``nn.Linear``, on the bundled model on the CPU: one engine of
each in one process, timed in turns.

    python bench/packed.py                       # 1 and 48 rows of decode, and a scoring pass
    python bench/packed.py --rows 1 --rounds 5

For each engine: a chat answer decoded alone (tokens/s), ``--rows`` seeded answers decoded together as one
job (tokens/s), and those answers scored (echo, the research measures' pass; tokens/s). Printed per round,
then the packed engine's speed over the plain one's (the median of the rounds), and whether both gave the
same answers.
"""

from __future__ import annotations

import argparse
import statistics
import time

from millm.config import get_settings
from millm.engine import load_engine, loader
from millm.engine.base import Engine
from millm.engine.events import Delta
from millm.registry import BUNDLED_ID, resolve
from millm.research.answers import chat_request, sample_answers
from millm.research.measure import NEUTRAL_PROMPTS, Measure


def rates(engine: Engine, rows: int, tokens: int) -> tuple[dict[str, float], list[str]]:
    """tokens/s of one answer alone, of ``rows`` answers in one job, and of scoring those answers."""
    prompts = [NEUTRAL_PROMPTS[i % len(NEUTRAL_PROMPTS)] for i in range(rows)]
    started = time.perf_counter()
    alone = list(engine.run_all([engine.prepare(chat_request(prompts[0], 0, tokens))]))
    single = sum(isinstance(e, Delta) for e in alone) / (time.perf_counter() - started)
    started = time.perf_counter()
    [texts] = sample_answers(engine, prompts, 0, tokens)
    batch = time.perf_counter() - started
    measure = Measure(engine, prompts, 0, tokens)
    started = time.perf_counter()
    scored = measure.logprobs(texts)
    score = time.perf_counter() - started
    made = sum(n for _, n in scored)
    return {"alone": single, "batch": made / batch, "score": made / score}, texts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=48, help="answers decoded together")
    parser.add_argument("--tokens", type=int, default=24, help="tokens per answer")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    settings = get_settings()
    entry = resolve(BUNDLED_ID, settings)
    packed = load_engine(entry, settings)
    loader.pack_linears = lambda model: 0  # the second engine keeps nn.Linear
    plain = load_engine(entry, settings)
    found: dict[str, list[dict[str, float]]] = {"packed": [], "plain": []}
    answers: dict[str, list[str]] = {}
    for _ in range(args.rounds):
        for name, engine in (("packed", packed), ("plain", plain)):
            got, answers[name] = rates(engine, args.rows, args.tokens)
            found[name].append(got)
            print(f"{name:>6}: " + ", ".join(f"{k} {v:.0f} tok/s" for k, v in got.items()), flush=True)
    for key in ("alone", "batch", "score"):
        ratio = statistics.median(p[key] / q[key] for p, q in zip(found["packed"], found["plain"]))
        print(f"{key}: packed {ratio:.2f}x plain")
    same = sum(a == b for a, b in zip(answers["packed"], answers["plain"]))
    print(f"same answers: {same} of {args.rows}")


if __name__ == "__main__":
    main()
