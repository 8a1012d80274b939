"""``torch.compile`` of the decode step on the CPU: does it pay? One decode step of the engine's own model (its
fused, packed or int8 layers, its slot cache, one row), eager against each decoder layer's forward compiled by
inductor, in one process; prints the compile time and the step times' ratio.

    python bench/compile.py [--weights dtype|int8] [--steps 40] [--rounds 3]

Inductor cannot lower oneDNN's packed product or FBGEMM's int8 product itself (it packs weights only when it
freezes them as constants), so each product is handed to it as an opaque custom operator (``bench::product``);
the rest of the layer (norms, rotary, the cache write, attention, the activation) is compiled. The compiled
layers are checked to give the eager step's logits (to 1e-4) before they are timed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from millm.config import get_settings
from millm.engine import load_engine
from millm.engine.decode.kv import KVShape, SlotCache
from millm.registry import BUNDLED_ID, resolve

PRODUCTS: list[torch.nn.Module] = []


@torch.library.custom_op("bench::product", mutates_args=())
def product(x: torch.Tensor, index: int, out_features: int) -> torch.Tensor:
    """``PRODUCTS[index](x)``, opaque to the compiler."""
    return PRODUCTS[index](x)


@product.register_fake
def _(x: torch.Tensor, index: int, out_features: int) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], out_features)


class Opaque(torch.nn.Module):
    """A product the compiler calls as one operator."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        PRODUCTS.append(inner)
        self.index, self.out_features = len(PRODUCTS) - 1, int(inner.out_features)  # type: ignore[arg-type]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return product(x, self.index, self.out_features)


def products_of(layer: Any) -> list[tuple[torch.nn.Module, str, torch.nn.Module, Opaque]]:
    """Each product of ``layer``: its owner, its name, itself and its opaque stand-in."""
    return [(owner, name, child, Opaque(child)) for owner in (layer.self_attn, layer.mlp)
            for name, child in list(owner.named_children()) if name.endswith("_proj")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--weights", default="dtype", choices=["dtype", "int8"])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    settings = get_settings()
    engine: Any = load_engine(resolve(BUNDLED_ID, settings), settings.model_copy(update={"weights": args.weights}))
    model = engine.model
    cache = SlotCache(KVShape.of(model.config), 1, 512, torch.float32, torch.device("cpu"))
    ids, positions = torch.tensor([[100]]), torch.tensor([[40]])

    def step() -> torch.Tensor:
        mask = cache.bind(0, positions, positions)
        return model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                     logits_to_keep=1).logits

    def timed(run: Callable[[], torch.Tensor]) -> float:
        start = time.perf_counter()
        for _ in range(args.steps):
            run()
        return (time.perf_counter() - start) / args.steps * 1e3

    torch.set_grad_enabled(False)
    layers = model.model.layers
    eager_forwards = [layer.forward for layer in layers]
    expected = step()
    swaps = [swap for layer in layers for swap in products_of(layer)]
    for owner, name, _, opaque in swaps:
        setattr(owner, name, opaque)
    torch._dynamo.config.cache_size_limit = 4 * len(layers)
    compiled_forwards = [torch.compile(f, dynamic=True) for f in eager_forwards]
    for layer, f in zip(layers, compiled_forwards):
        layer.forward = f
    start = time.perf_counter()
    got = step()
    compile_s = time.perf_counter() - start
    assert torch.allclose(got, expected, atol=1e-4), float((got - expected).abs().max())

    def use(forwards: list[Callable[..., Any]], opaque: bool) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            for layer, f in zip(layers, forwards):
                layer.forward = f
            for owner, name, plain, stand_in in swaps:
                setattr(owner, name, stand_in if opaque else plain)
            return step()
        return run

    eager, compiled = use(eager_forwards, False), use(compiled_forwards, True)
    eager(), compiled()
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(args.rounds):
        eager()
        times["eager"].append(timed(step))
        compiled()
        times["compiled"].append(timed(step))
    e, c = statistics.median(times["eager"]), statistics.median(times["compiled"])
    print(f"{args.weights} weights, {torch.get_num_threads()} threads, one row, span 64, "
          f"medians of {args.rounds} interleaved rounds of {args.steps} steps")
    print(f"compile (30 layers, first step): {compile_s:.1f} s")
    print(f"eager step    {e:6.1f} ms   ({', '.join(f'{t:.1f}' for t in times['eager'])})")
    print(f"compiled step {c:6.1f} ms   ({', '.join(f'{t:.1f}' for t in times['compiled'])})")
    print(f"compiled / eager speed: {e / c:.2f}x")


if __name__ == "__main__":
    main()
