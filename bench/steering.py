"""Steering overhead on decode, in one run.

    python bench/steering.py [--tokens 96] [--rounds 3] [--d-sae 8192]

Greedy decode tokens/s of the bundled model with: no SAE; one SAE attached with 16 features steered;
that plus monitoring of 64 features; and the cost of return_sae_activations (top_k 8, all positions)
as a share of the request time. The SAE is random (ReLU, d_sae configurable): the cost does not
depend on what it learned.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from millm.config import get_settings
from millm.engine import load_engine
from millm.engine.events import Usage
from millm.engine.params import GenerationRequest, TextPrompt
from millm.registry import resolve
from millm.sae.model import SAE
from millm.steering.monitor import MonitorConfig
from millm.validation import sampling_params

PROMPT = "Once upon a time, in a village by the sea, there lived"


def random_sae(d_in: int, d_sae: int) -> SAE:
    g = torch.Generator().manual_seed(0)
    W_dec = torch.nn.functional.normalize(torch.randn(d_sae, d_in, generator=g), dim=-1)
    return SAE(W_enc=W_dec.T.contiguous(), b_enc=torch.zeros(d_sae), W_dec=W_dec, b_dec=torch.zeros(d_in))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--d-sae", type=int, default=8192)
    parser.add_argument("--layer", type=int, default=10)
    args = parser.parse_args()

    settings = get_settings()
    engine = load_engine(resolve(settings.default_model, settings), settings)
    params = sampling_params({"temperature": 0, "max_tokens": args.tokens})

    def run(readout: dict | None = None) -> float:
        start = time.perf_counter()
        events = list(engine.generate(GenerationRequest([TextPrompt(PROMPT)], params, readout=readout)))
        usage = events[-1]
        assert isinstance(usage, Usage) and usage.completion_tokens == args.tokens, "decode ended early"
        return time.perf_counter() - start

    def set_up(case: str) -> None:
        engine.steering.detach_all()
        engine.monitor.configure(MonitorConfig())
        if case == "none":
            return
        engine.steering.attach("sae_bench", random_sae(engine.steering.d_model, args.d_sae), args.layer)
        engine.steering.set_values("sae_bench", {i * 37: 2.0 for i in range(16)}, merge=False)
        if case == "monitor":
            engine.monitor.configure(MonitorConfig(True, "sae_bench", list(range(0, 64 * 5, 5)), 100))

    cases = ["none", "steer", "monitor", "readout"]
    times: dict[str, list[float]] = {c: [] for c in cases}
    for case in cases:  # warm up every path once
        set_up(case)
        run({"positions": "all", "top_k": 8} if case == "readout" else None)
    for _ in range(args.rounds):
        for case in cases:
            set_up(case)
            times[case].append(run({"positions": "all", "top_k": 8} if case == "readout" else None))
    engine.steering.detach_all()
    median = {c: statistics.median(t) for c, t in times.items()}
    tps = {c: args.tokens / median[c] for c in cases}
    print(f"{engine.model_id}, {args.tokens} greedy tokens, SAE d_sae={args.d_sae} at layer {args.layer}, "
          f"medians of {args.rounds} rounds")
    print(f"no SAE:                          {tps['none']:7.1f} tok/s")
    print(f"1 SAE, 16 features steered:      {tps['steer']:7.1f} tok/s   ratio {tps['steer'] / tps['none']:.3f}")
    print(f"  + monitoring 64 features:      {tps['monitor']:7.1f} tok/s   ratio {tps['monitor'] / tps['none']:.3f}")
    extra = (median["readout"] - median["steer"]) / median["readout"]
    print(f"return_sae_activations (top_k 8, all positions): {extra * 100:.1f}% of the request time")


if __name__ == "__main__":
    main()
