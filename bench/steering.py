"""Steering overhead on decode, in one run.

    python bench/steering.py [--tokens 96] [--rounds 3] [--d-sae 8192]

Greedy decode tokens/s of the bundled model with: no SAE; one SAE attached with 16 features steered;
that plus monitoring of 64 features; 4 steering vector sets (``millm vectors``) at layers 8, 10, 12 and 14, each
steered; a native two-layer circuit (two SAEs, 16 members each) dialled
per request (the request's steering resolved from an imported circuit through the store, as a
``steering_intensity`` request is, inside the timed region); and the cost of return_sae_activations
(top_k 8, all positions) as a share of the request time. The SAEs are random (ReLU, d_sae
configurable): the cost does not depend on what they learned.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from millm.config import get_settings
from millm.engine import load_engine
from millm.engine.events import Usage
from millm.engine.params import GenerationRequest, TextPrompt
from millm.registry import resolve
from millm.requests.validation import sampling_params
from millm.sae.model import SAE
from millm.sae.vector_sets import VectorSet
from millm.steering.bases import Bases
from millm.steering.documents import Registered
from millm.steering.imports import import_document
from millm.steering.intensity import IntensitySettings
from millm.steering.monitor import MonitorConfig
from millm.steering.readout import ReadoutAsk, check_readout
from millm.store import Store

PROMPT = "Once upon a time, in a village by the sea, there lived"
CIRCUIT = "bench-circuit"
DIAL = 0.8
VECTOR_LAYERS = (8, 10, 12, 14)


def random_sae(d_in: int, d_sae: int, seed: int = 0) -> SAE:
    g = torch.Generator().manual_seed(seed)
    W_dec = torch.nn.functional.normalize(torch.randn(d_sae, d_in, generator=g), dim=-1)
    return SAE(W_enc=W_dec.T.contiguous(), b_enc=torch.zeros(d_sae), W_dec=W_dec, b_dec=torch.zeros(d_in))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--d-sae", type=int, default=8192)
    parser.add_argument("--layer", type=int, default=10)
    parser.add_argument("--layer2", type=int, default=20, help="the circuit's second layer")
    args = parser.parse_args()

    settings = get_settings()
    engine = load_engine(resolve(settings.default_model, settings), settings)
    params = sampling_params({"temperature": 0, "max_tokens": args.tokens})
    target = engine.steering_target()
    assert target is not None, f"{engine.model_id} cannot be steered"
    layers = {"sae_bench": args.layer, "sae_bench2": args.layer2}
    store = Store(Path(tempfile.mkdtemp(prefix="millm-bench-")) / "millm.db")
    members = [{"layer": layer, "feature": i * 37 + j, "strength": 2.0}
               for j, layer in enumerate(layers.values()) for i in range(16)]
    import_document(store, "circuit", {"kind": "circuit", "name": CIRCUIT, "model": engine.model_id,
                                       "members": members, "intensity_range": [0.5, 1.5], "evidence": {"rung": 2}},
                    Registered({sae: args.d_sae for sae in layers}, {layer: sae for sae, layer in layers.items()}))
    bases = Bases(store, target, IntensitySettings.from_settings(settings))

    def run(readout: ReadoutAsk | None = None, dialled: bool = False) -> float:
        start = time.perf_counter()
        steering = None
        if dialled:
            steering = bases.request(CIRCUIT, DIAL)
            assert steering.rung == 2 and steering.echo == "0.8", "the circuit does not serve natively"
        request = GenerationRequest([TextPrompt(PROMPT)], params, readout=readout, steering=steering)
        events = list(engine.generate(request))
        usage = events[-1]
        assert isinstance(usage, Usage) and usage.completion_tokens == args.tokens, "decode ended early"
        return time.perf_counter() - start

    def set_up(case: str) -> None:
        engine.steering.detach_all()
        engine.monitor.configure(MonitorConfig())
        if case == "none":
            return
        if case == "circuit":
            for seed, (sae, layer) in enumerate(layers.items()):
                engine.steering.attach(sae, random_sae(engine.steering.d_model, args.d_sae, seed), layer)
            return
        if case == "vectors":
            for seed, layer in enumerate(VECTOR_LAYERS):
                name = f"vec{layer}"
                direction = random_sae(engine.steering.d_model, 1, seed).W_dec
                vs = VectorSet((name,), direction, layer, engine.model_id)
                engine.steering.attach(name, vs.as_sae(), layer)
                engine.steering.set_values(name, {0: 8.0}, merge=False)
            return
        engine.steering.attach("sae_bench", random_sae(engine.steering.d_model, args.d_sae), args.layer)
        engine.steering.set_values("sae_bench", {i * 37: 2.0 for i in range(16)}, merge=False)
        if case == "monitor":
            engine.monitor.configure(MonitorConfig(True, "sae_bench", list(range(0, 64 * 5, 5)), 100))

    cases = ["none", "steer", "monitor", "vectors", "circuit", "readout"]
    times: dict[str, list[float]] = {c: [] for c in cases}

    def measure(case: str) -> float:
        return run(check_readout({"positions": "all", "top_k": 8}) if case == "readout" else None,
                   dialled=case == "circuit")

    for case in cases:  # warm up every path once
        set_up(case)
        measure(case)
    for _ in range(args.rounds):
        for case in cases:
            set_up(case)
            times[case].append(measure(case))
    engine.steering.detach_all()
    median = {c: statistics.median(t) for c, t in times.items()}
    tps = {c: args.tokens / median[c] for c in cases}
    print(f"{engine.model_id}, {args.tokens} greedy tokens, SAE d_sae={args.d_sae} at layer {args.layer}, "
          f"medians of {args.rounds} rounds")
    print(f"no SAE:                          {tps['none']:7.1f} tok/s")
    print(f"1 SAE, 16 features steered:      {tps['steer']:7.1f} tok/s   ratio {tps['steer'] / tps['none']:.3f}")
    print(f"  + monitoring 64 features:      {tps['monitor']:7.1f} tok/s   ratio {tps['monitor'] / tps['none']:.3f}")
    print(f"4 vector sets (layers {', '.join(map(str, VECTOR_LAYERS))}), each steered: {tps['vectors']:7.1f} tok/s   "
          f"ratio {tps['vectors'] / tps['none']:.3f}")
    print(f"native circuit, 2 SAEs (layers {args.layer}, {args.layer2}) x 16 members, dialled per request "
          f"(steering_intensity {DIAL}): {tps['circuit']:7.1f} tok/s   ratio {tps['circuit'] / tps['none']:.3f}")
    extra = (median["readout"] - median["steer"]) / median["readout"]
    print(f"return_sae_activations (top_k 8, all positions): {extra * 100:.1f}% of the request time")


if __name__ == "__main__":
    main()
