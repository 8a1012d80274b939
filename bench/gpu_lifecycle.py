"""Model lifecycle on a GPU machine: the memory estimate against what a load takes, an out-of-memory
request answered as insufficient_memory with the engine still usable, and (with several cards) a split load
that steers on the card holding its layer.

    python bench/gpu_lifecycle.py

Prints each check and its figures; exits non-zero when one fails. On a CPU-only machine it says so and stops.
"""

from __future__ import annotations

import sys

import torch

from millm.config import get_settings
from millm.engine import load_engine, preflight
from millm.engine.events import Usage
from millm.engine.loader import placement
from millm.engine.params import GenerationRequest, TextPrompt
from millm.engine.worker import typed
from millm.errors import InsufficientMemory
from millm.registry import resolve
from millm.requests.validation import sampling_params


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check here")
        return 0
    settings = get_settings()
    entry = resolve(settings.default_model, settings)
    before = torch.cuda.memory_allocated()
    predicted = preflight.footprint(entry, 2)
    engine = load_engine(entry, settings)
    used = torch.cuda.memory_allocated() - before
    print(f"weights: predicted {predicted.weights / 2**20:.0f} MiB, allocated {used / 2**20:.0f} MiB "
          f"(ratio {used / predicted.weights:.2f})")
    failures = 0
    huge = GenerationRequest([TextPrompt("hello " * 200)], sampling_params({"temperature": 0, "max_tokens": 4,
                                                                             "n": 128}))
    free = torch.cuda.mem_get_info()[0]
    hog = torch.empty(max(free - 64 * 2**20, 0), dtype=torch.uint8, device="cuda")  # leave the request no room
    try:
        list(engine.generate(huge))
        print("out-of-memory: the request fitted after all (no check)")
    except Exception as exc:  # what the worker would hand the client
        mapped = typed(exc)
        ok = isinstance(mapped, InsufficientMemory)
        failures += not ok
        print(f"out-of-memory -> {type(mapped).__name__}: {'ok' if ok else 'FAILED'}")
    finally:
        del hog
        torch.cuda.empty_cache()
    again = [e for e in engine.generate(GenerationRequest([TextPrompt("hello")], sampling_params(
        {"temperature": 0, "max_tokens": 4}))) if isinstance(e, Usage)]
    ok = bool(again) and again[0].completion_tokens == 4
    failures += not ok
    print(f"engine usable after the out-of-memory error: {'ok' if ok else 'FAILED'}")
    cards = {i: int(torch.cuda.mem_get_info(i)[0]) for i in range(torch.cuda.device_count())}
    print(f"cards: {', '.join(f'cuda:{i} {b / 2**30:.1f} GiB free' for i, b in cards.items())}; "
          f"placement for this model: {placement(engine.model, cards) or 'one card'}")
    if len(cards) > 1:
        size = sum(p.numel() * p.element_size() for p in engine.model.parameters())
        plan = placement(engine.model, {i: size * 6 // 10 for i in cards})
        print(f"forced split plan over {len(cards)} cards: {sorted(set(plan.values())) if plan else None}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
