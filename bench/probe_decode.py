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
from dataclasses import replace

import torch
from interleaved import interleaved

from millm.config import get_settings
from millm.engine import load_engine
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
    print(f"{args.tokens} tokens a request, {args.rounds} rounds; tokens/s unwatched, watched (4 flag + 1 armed steer)")
    interleaved(engine, args.rounds, ("none", lambda: plain), ("probes", lambda: watched))


if __name__ == "__main__":
    main()
