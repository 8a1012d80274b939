"""How well an SAE reconstructs its layer, on held-out text: FVU and the CE share of the zero-ablation gap.

The definitions are those of ``bench/sae_quality.py`` (targets there: FVU <= 0.15, CE share <= 10%):

- FVU: the residual sum of squares of the SAE's reconstruction over the total sum of squares around the
  mean (:func:`millm.sae.training.train.fraction_unexplained`), over every position of the held-out windows but
  each window's first (an attention sink, as in training);
- CE: the model's mean next-token loss over the windows clean, with the SAE's reconstruction spliced in
  at its layer, and with that layer's output zeroed (each window's first position left as it was in
  both); the SAE's share of the zero-ablation gap is ``(spliced - clean) / (zeroed - clean)``.

``millm sae train`` measures both on the held-out split it made and records them in ``train.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from millm.sae import activations
from millm.sae.model import SAE

FVU_TARGET = 0.15
CE_SHARE_TARGET = 0.10
CE_BATCH = 4  # windows per forward pass of the CE figures


def ce_share(clean: float, spliced: float, zeroed: float) -> float:
    """The SAE's share of the zero-ablation gap: ``(spliced - clean) / (zeroed - clean)`` (NaN without a gap)."""
    gap = zeroed - clean
    return (spliced - clean) / gap if gap != 0 else float("nan")


def reconstruct(sae: SAE, x: torch.Tensor) -> torch.Tensor:
    """The SAE's reconstruction of ``x`` (in the SAE's dtype)."""
    return sae.decode(sae.encode(x), x)


@torch.inference_mode()
def fvu(sae: SAE, acts: torch.Tensor, chunk: int = 4096) -> tuple[float, torch.Tensor]:
    """(FVU of the SAE's reconstruction of ``acts`` ``[N, d_in]``, which features fired on any row).

    Computed in chunks (the dense code of a wide SAE is large) with float64 sums; equal to
    ``fraction_unexplained(acts, reconstruction)`` on the whole.
    """
    n, d = acts.shape
    if n == 0:
        raise ValueError("No activations to measure the FVU on.")
    residual = torch.zeros((), dtype=torch.float64)
    total = torch.zeros(d, dtype=torch.float64)
    squares = torch.zeros(d, dtype=torch.float64)
    fired = torch.zeros(sae.d_sae, dtype=torch.bool)
    for lo in range(0, n, chunk):
        x = acts[lo:lo + chunk].float()
        code = sae.encode(x)
        fired |= (code > 0).any(0).cpu()
        recon = sae.decode(code, x).float()
        residual += (x - recon).double().pow(2).sum()
        total += x.double().sum(0)
        squares += x.double().pow(2).sum(0)
    around_mean = (squares - total.pow(2) / n).sum()
    return float(residual / around_mean.clamp_min(1e-12)), fired


def splice(sae: SAE | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """Layer output -> the SAE's reconstruction (or zeros with ``None``), leaving each window's first
    position as it was (for :func:`millm.sae.activations.replaced_output`)."""
    moved: dict[tuple[torch.device, torch.dtype], SAE] = {}

    def fn(hidden: torch.Tensor) -> torch.Tensor:
        out = hidden.clone()
        rest = hidden[:, 1:].float()
        if sae is None:
            out[:, 1:] = torch.zeros_like(rest)
        else:
            key = (rest.device, torch.float32)
            if key not in moved:
                moved[key] = sae.to(rest.device, torch.float32)
            out[:, 1:] = reconstruct(moved[key], rest).to(out.dtype)
        return out
    return fn


@torch.inference_mode()
def next_token_loss(model: Any, windows: torch.Tensor, batch: int = CE_BATCH) -> float:
    """The model's mean next-token cross-entropy over ``windows`` ``[n, T]`` (every position predicting the next)."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for lo in range(0, windows.shape[0], batch):
        ids = windows[lo:lo + batch].to(device)
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum")
        total, count = total + float(loss), count + ids[:, 1:].numel()
    return total / count


@dataclass(frozen=True)
class Reconstruction:
    """The held-out figures of one SAE at one layer."""

    fvu: float
    ce_share: float
    ce_clean: float
    ce_spliced: float
    ce_zeroed: float
    dead_fraction: float  # features that fired on no held-out token
    windows: int
    tokens: int  # positions the FVU is measured on
    ce_tokens: int  # next-token predictions in each CE figure


def measure(model: Any, sae: SAE, layer: int, windows: torch.Tensor,
            progress: Callable[[int], None] | None = None) -> Reconstruction:
    """FVU and CE share of ``sae`` at ``layer`` on token ``windows`` ``[n, T]`` (cap them before calling:
    the cost is one partial and three full forward passes over them); ``progress(done)`` counts 0..4."""
    report = progress or (lambda done: None)
    acts = activations.collect(model, windows, layer)
    fraction, fired = fvu(sae, acts)
    report(1)
    clean = next_token_loss(model, windows)
    report(2)
    with activations.replaced_output(model, layer, splice(sae)):
        spliced = next_token_loss(model, windows)
    report(3)
    with activations.replaced_output(model, layer, splice(None)):
        zeroed = next_token_loss(model, windows)
    report(4)
    return Reconstruction(fvu=fraction, ce_share=ce_share(clean, spliced, zeroed), ce_clean=clean,
                          ce_spliced=spliced, ce_zeroed=zeroed, dead_fraction=float((~fired).float().mean()),
                          windows=windows.shape[0], tokens=acts.shape[0], ce_tokens=windows[:, 1:].numel())

