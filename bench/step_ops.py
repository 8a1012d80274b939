"""The aten operations of one batch-1 greedy decode step on the transformers engine, counted with torch.profiler:
per decoder layer, and outside the layers (embedding, rotary, final norm, output projection, sampling, the
scheduler's bookkeeping). Counts do not depend on the machine's load, so this is the trustworthy figure of a
step's dispatch overhead on a shared machine.

    python bench/step_ops.py [--weights int8|dtype] [--short 8] [--long 24] [--top 40]

Two greedy generations of ``--short`` and ``--long`` tokens are profiled through ``engine.generate`` (the decode
driver's path); the difference divided by the tokens between them is one decode step. Each decoder layer's
forward runs inside a ``record_function`` range, so an op is counted in a layer when it lies in one. Only
top-level aten ops are counted (an op called by another op, aten's or a kernel's, is part of it, not a dispatch of
its own); a kernel's own op (``quantized::``, ``mkldnn::``) is counted beside them.
"""

from __future__ import annotations

import argparse
import collections
from functools import wraps
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from millm.config import get_settings
from millm.engine import load_engine
from millm.engine.base import Engine
from millm.engine.params import GenerationRequest, TextPrompt
from millm.registry import BUNDLED_ID, resolve
from millm.requests.validation import sampling_params

PROMPT = "Once upon a time, in a village by the sea, there lived"
LAYER = "millm.layer"


def marked(model: Any) -> None:
    """Every decoder layer's forward run inside a ``record_function`` range (in place)."""
    for layer in getattr(model, model.base_model_prefix).layers:
        inner = layer.forward

        @wraps(inner)
        def forward(*args: Any, _inner: Any = inner, **kwargs: Any) -> Any:
            with record_function(LAYER):
                return _inner(*args, **kwargs)

        layer.forward = forward


def counted(engine: Engine, tokens: int) -> tuple[collections.Counter[str], collections.Counter[str], int]:
    """Top-level aten op counts inside decoder layers and outside them over one greedy generation of ``tokens``
    tokens, and how many layer forwards ran."""
    request = GenerationRequest([TextPrompt(PROMPT)], sampling_params({"temperature": 0, "max_tokens": tokens,
                                                                       "min_tokens": tokens}))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        list(engine.generate(request))
    inside: collections.Counter[str] = collections.Counter()
    outside: collections.Counter[str] = collections.Counter()
    layers = 0
    for event in prof.events():
        if event.name == LAYER:
            layers += 1
            continue
        if "::" not in event.name:
            continue
        parent, in_layer, nested = event.cpu_parent, False, False
        while parent is not None:
            if parent.name == LAYER:
                in_layer = True
            elif "::" in parent.name:  # inside another op (aten's, or a quantized or oneDNN kernel's)
                nested = True
            parent = parent.cpu_parent
        if not nested:
            (inside if in_layer else outside)[event.name] += 1
    return inside, outside, layers


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--weights", default="int8", choices=["int8", "dtype"])
    parser.add_argument("--short", type=int, default=8)
    parser.add_argument("--long", type=int, default=24)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    settings = get_settings()
    engine = load_engine(resolve(BUNDLED_ID, settings), settings.model_copy(update={"weights": args.weights}))
    model = engine.model  # type: ignore[attr-defined]
    n_layers = len(getattr(model, model.base_model_prefix).layers)
    marked(model)
    counted(engine, 2)  # warm up
    a_in, a_out, a_layers = counted(engine, args.short)
    b_in, b_out, b_layers = counted(engine, args.long)
    steps = args.long - args.short
    forwards = (b_layers - a_layers) / steps / n_layers
    per_layer = {k: (b_in[k] - a_in[k]) / steps / n_layers for k in set(a_in) | set(b_in)}
    outside = {k: (b_out[k] - a_out[k]) / steps for k in set(a_out) | set(b_out)}
    print(f"{args.weights} weights, one decode step ({steps} steps between {args.short} and {args.long} tokens); "
          f"{forwards:.2f} forward(s) of each of {n_layers} layers a step")
    layer_ops, outside_ops = sum(per_layer.values()), sum(outside.values())
    print(f"aten ops per decoder layer: {layer_ops:.1f}; outside the layers: {outside_ops:.1f}; "
          f"a step: {layer_ops * n_layers + outside_ops:.0f}")
    for title, table in (("per layer", per_layer), ("outside the layers, per step", outside)):
        print(f"-- {title}")
        for name, count in sorted(table.items(), key=lambda kv: -kv[1])[:args.top]:
            if abs(count) >= 0.05:
                print(f"  {count:7.2f}  {name}")


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
