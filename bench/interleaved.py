"""One greedy request decoded under two conditions, interleaved in one run on one loaded model, and the ratio of
their tokens/s by the wall clock and by this process's CPU time (steadier on a shared machine: run with
``OMP_NUM_THREADS=1`` so the CPU time is the work done). The A/B loop of ``bench/probe_decode.py`` and
``bench/sensing_decode.py``."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from millm.engine.events import Usage


def timed(engine: Any, plan: Any) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, tokens) of one run."""
    began, cpu = time.perf_counter(), time.process_time()
    tokens = next(e.completion_tokens for e in engine.run(plan) if isinstance(e, Usage))
    return time.perf_counter() - began, time.process_time() - cpu, tokens


def interleaved(engine: Any, rounds: int, base: tuple[str, Callable[[], Any]],
                other: tuple[str, Callable[[], Any]]) -> None:
    """``rounds`` rounds of both conditions, their order alternating; each is ``(name, set up)``, the set-up putting
    the engine in that condition and returning the plan to run. Prints each round's rates and ratio (other over
    base), then the median ratios."""
    timed(engine, base[1]())  # warm-up
    walls, cpus = [], []
    for i in range(rounds):
        wall, cpu = {}, {}
        for name, setup in [base, other][:: 1 if i % 2 == 0 else -1]:
            seconds, used, tokens = timed(engine, setup())
            wall[name], cpu[name] = tokens / seconds, tokens / used
        walls.append(wall[other[0]] / wall[base[0]])
        cpus.append(cpu[other[0]] / cpu[base[0]])
        print(f"round {i + 1}: wall {wall[base[0]]:.1f} vs {wall[other[0]]:.1f} tok/s, {walls[-1]:.3f}x; CPU time "
              f"{cpu[base[0]]:.1f} vs {cpu[other[0]]:.1f} tok/CPU-s, {cpus[-1]:.3f}x", flush=True)
    for name, ratios in (("wall", walls), ("CPU time", cpus)):
        print(f"{name}: median {statistics.median(ratios):.3f}x (min {min(ratios):.3f}x, max {max(ratios):.3f}x)")
