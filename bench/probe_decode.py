"""Decode speed with probes watching vs none, interleaved in one run on one loaded model.

    python bench/probe_decode.py                   # 7 rounds of 96 tokens
    python bench/probe_decode.py --rounds 3 --tokens 32

Each round decodes the same greedy request twice, in alternating order: unwatched, and watched by four ``flag``
probes (layers 8, 12, 16 and 20) and one armed ``steer`` probe (layer 14) whose threshold is never reached (so
its check runs every step and the text stays the same). Printed: each round's tokens/s of both and their ratio,
by the wall clock and by this process's CPU time (steadier on a shared machine: run it with
``OMP_NUM_THREADS=1`` so the CPU time is the work done), then the median ratios (the target is >= 0.97x).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch

from millm.config import get_settings
from millm.engine import load_engine
from millm.engine.events import Usage
from millm.engine.params import ChatPrompt, GenerationRequest, SamplingParams
from millm.registry import BUNDLED_ID, resolve
from millm.steering.core import RequestSteering
from millm.steering.probe import Watch

NEVER = 1e30  # a threshold no score reaches


def watches(d_model: int) -> tuple[Watch, ...]:
    g = torch.Generator().manual_seed(0)

    def unit() -> list[float]:
        w = torch.randn(d_model, generator=g)
        return (w / w.norm()).tolist()

    flags = [Watch(f"flag{layer}", layer, unit(), 0.0, "max", "response", NEVER) for layer in (8, 12, 16, 20)]
    armed = Watch("armed", 14, unit(), 0.0, "max", "response", NEVER, "steer", "armed", RequestSteering("armed", {}))
    return (*flags, armed)


def timed(engine, plan) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, tokens) of one run."""
    began, cpu = time.perf_counter(), time.process_time()
    tokens = next(e.completion_tokens for e in engine.run(plan) if isinstance(e, Usage))
    return time.perf_counter() - began, time.process_time() - cpu, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=96)
    args = parser.parse_args()
    settings = get_settings()
    engine = load_engine(resolve(BUNDLED_ID, settings), settings)
    request = GenerationRequest([ChatPrompt([{"role": "user", "content": "Write a long story about a lighthouse."}])],
                                SamplingParams(temperature=0.0, max_tokens=args.tokens))
    plain = engine.prepare(request)
    watched = replace(plain, probes=watches(engine.steering.d_model))
    timed(engine, plain)  # warm-up
    walls, cpus = [], []
    print(f"{args.tokens} tokens a request, {args.rounds} rounds; tokens/s unwatched, watched (4 flag + 1 armed steer)")
    for i in range(args.rounds):
        order = [(plain, "none"), (watched, "probes")][:: 1 if i % 2 == 0 else -1]
        wall, cpu = {}, {}
        for plan, name in order:
            seconds, used, tokens = timed(engine, plan)
            wall[name], cpu[name] = tokens / seconds, tokens / used
        walls.append(wall["probes"] / wall["none"])
        cpus.append(cpu["probes"] / cpu["none"])
        print(f"round {i + 1}: wall {wall['none']:.1f} vs {wall['probes']:.1f} tok/s, {walls[-1]:.3f}x; CPU time "
              f"{cpu['none']:.1f} vs {cpu['probes']:.1f} tok/CPU-s, {cpus[-1]:.3f}x", flush=True)
    for name, ratios in (("wall", walls), ("CPU time", cpus)):
        print(f"{name}: median {statistics.median(ratios):.3f}x (min {min(ratios):.3f}x, max {max(ratios):.3f}x)")


if __name__ == "__main__":
    main()
