"""Each feature's activations over a corpus every install ships, as a histogram: the feature page's distribution
(what sae_vis and SAEDashboard draw under a feature).

The corpus is the part of the default SAE corpus that ships with every Python (``millm.sae.training.corpus``): the
held-out tenth of its documentation (seed 0), the part no bundled SAE trained on, ``WINDOWS`` windows of
``CONTEXT`` tokens, each window's first token left out (an attention sink, as in training). It is read at the SAE's
layer with no steering (a forward outside the decode loop is never steered), and every feature's histogram is
computed at once, so a page's next feature costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

BINS = 24  # bars over a feature's firing values
WINDOWS = 32
CONTEXT = 128
CORPUS = "held-out Python documentation"


@dataclass(frozen=True)
class Histograms:
    """Every feature's histogram of its non-zero values over ``tokens`` tokens: ``BINS`` equal bins from
    ``low`` (0, or the lowest value where a value is negative) to ``high`` (the largest)."""

    tokens: int
    firing: torch.Tensor  # [d_sae] tokens with a non-zero value
    low: torch.Tensor  # [d_sae]
    high: torch.Tensor  # [d_sae]
    counts: torch.Tensor  # [d_sae, BINS]

    def of(self, index: int) -> dict[str, Any]:
        """One feature's histogram, as the API reports it."""
        low, high = float(self.low[index]), float(self.high[index])
        width = (high - low) / self.counts.shape[1]
        firing = int(self.firing[index])
        return {"corpus": CORPUS, "tokens": self.tokens, "firing": firing,
                "firing_fraction": round(firing / self.tokens, 6) if self.tokens else 0.0,
                "bins": [{"low": round(low + i * width, 4), "high": round(low + (i + 1) * width, 4), "count": int(c)}
                         for i, c in enumerate(self.counts[index].tolist())]}


def histograms(acts: torch.Tensor, bins: int = BINS) -> Histograms:
    """The histograms of ``acts`` (``[tokens, d_sae]``), one per column, over its non-zero values. Pure."""
    tokens, width = acts.shape
    rows, cols = acts.nonzero(as_tuple=True)
    values = acts[rows, cols].float()
    high = torch.zeros(width).scatter_reduce(0, cols, values, "amax", include_self=True)
    low = torch.zeros(width).scatter_reduce(0, cols, values, "amin", include_self=True)
    span = (high - low).clamp_min(1e-12)
    slot = ((values - low[cols]) / span[cols] * bins).long().clamp(0, bins - 1)
    counts = torch.bincount(cols * bins + slot, minlength=width * bins).reshape(width, bins)
    firing = torch.bincount(cols, minlength=width)
    return Histograms(tokens, firing, low, high, counts)


@torch.inference_mode()
def corpus_histograms(model: Any, tokenizer: Any, sae: Any, layer: int) -> Histograms:
    """``sae``'s histograms over the shipped corpus, read at ``layer`` of ``model`` (on the engine's thread)."""
    from millm.sae.activations import collect
    from millm.sae.training.corpus import python_documentation, split_documents, token_windows

    _, held_out = split_documents(python_documentation(), 0.1, 0)
    windows = token_windows(tokenizer, held_out, CONTEXT, WINDOWS)
    residuals = collect(model, windows, layer)
    device = sae.W_dec.device
    acts = torch.cat([sae.encode(chunk.to(device)).float().cpu() for chunk in residuals.split(1024)])
    return histograms(acts)
