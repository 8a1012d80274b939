"""Reading a model's residual stream where miLLM steers it: the output of decoder layer L (resid_post).

The hook sits on the same module the steering controller hooks (``decoder_layers(model)[L]``), so an
SAE trained on what it reads sees exactly what it will later steer. Layers after L are skipped by
stopping the forward pass from the hook: collecting at layer 10 of 30 costs a third of a forward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch


def decoder_layers(model: Any) -> Any:
    """The list of decoder blocks of a HF causal LM: where SAEs read (here) and steer (the steering controller)."""
    return model.get_decoder().layers


class _Collected(Exception):
    """Raised by the hook once layer L has run: nothing after it is needed."""


def _hidden(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def layer_count(model: Any) -> int:
    return len(decoder_layers(model))


def check_layer(model: Any, layer: int) -> None:
    count = layer_count(model)
    if not 0 <= layer < count:
        raise ValueError(f"'layer' must be between 0 and {count - 1} for this model, got {layer}.")


def captured_output(model: Any, layer: int, forward: Callable[[], Any]) -> torch.Tensor:
    """Decoder layer ``layer``'s output during ``forward()``, which stops there (nothing after it is needed)."""
    captured: list[torch.Tensor] = []

    def hook(module: Any, args: Any, output: Any) -> None:
        captured.append(_hidden(output))
        raise _Collected

    handle = decoder_layers(model)[layer].register_forward_hook(hook)
    try:
        forward()
    except _Collected:
        pass
    finally:
        handle.remove()
    return captured[0]


@torch.inference_mode()
def resid_post(model: Any, ids: torch.Tensor, layer: int) -> torch.Tensor:
    """Layer ``layer``'s output for a batch of token windows ``[B, T]``: ``[B, T, d_model]`` (fp32, CPU)."""
    check_layer(model, layer)
    device = next(model.parameters()).device
    return captured_output(model, layer, lambda: model(input_ids=ids.to(device), use_cache=False)).float().cpu()


def collect(model: Any, windows: torch.Tensor, layer: int, *, batch_size: int = 8, skip_first: int = 1,
            out: torch.Tensor | None = None, start: int = 0,
            on_batch: Callable[[int, int], None] | None = None) -> torch.Tensor:
    """Activations of every window position except the first ``skip_first`` (attention sinks, whose
    norms are outliers), as ``[windows * (T - skip_first), d_model]`` rows in window order.

    ``out`` (preallocated, any float dtype) is filled from window ``start`` on, so a long collection can
    resume where it stopped; ``on_batch(windows_done, rows_written)`` reports progress.
    """
    n, length = windows.shape
    per_window = length - skip_first
    if per_window < 1:
        raise ValueError(f"Windows of {length} tokens leave nothing after skipping {skip_first}.")
    d_model = int(model.config.hidden_size)
    if out is None:
        out = torch.empty(n * per_window, d_model)
    for lo in range(start, n, batch_size):
        hi = min(lo + batch_size, n)
        acts = resid_post(model, windows[lo:hi], layer)[:, skip_first:]
        out[lo * per_window:hi * per_window] = acts.reshape(-1, d_model).to(out.dtype)
        if on_batch is not None:
            on_batch(hi, hi * per_window)
    return out


@contextmanager
def replaced_output(model: Any, layer: int, fn: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """Within the block, layer ``layer``'s output ``h`` is replaced by ``fn(h)`` (SAE splice, ablation)."""
    check_layer(model, layer)

    def hook(module: Any, args: Any, output: Any) -> Any:
        new = fn(_hidden(output)).to(_hidden(output).dtype)
        return (new, *output[1:]) if isinstance(output, tuple) else new

    handle = decoder_layers(model)[layer].register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()
