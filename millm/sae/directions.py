"""What a feature's decoder direction says on its own: the tokens it promotes and suppresses through the unembedding
(with their logit values), and the features nearest it by decoder cosine among SAEs and vector sets at its layer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Neighbour:
    sae: str
    index: int
    cosine: float


def extremes(logits: torch.Tensor, k: int) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """The ``k`` token ids with the highest logits and the ``k`` with the lowest, each with its value."""
    k = min(k, logits.numel())
    top, bottom = logits.topk(k), (-logits).topk(k)
    return ([(int(i), float(v)) for v, i in zip(top.values, top.indices)],
            [(int(i), -float(v)) for v, i in zip(bottom.values, bottom.indices)])


def nearest(direction: torch.Tensor, decoders: Mapping[str, torch.Tensor], k: int,
            exclude: tuple[str, int] | None = None) -> list[Neighbour]:
    """The ``k`` rows of ``decoders`` (per SAE or vector set, ``[d_sae, d_in]``) with the highest cosine to
    ``direction``, across all of them; ``exclude`` (the feature itself) left out."""
    unit = direction.float() / direction.float().norm().clamp_min(1e-12)
    found: list[Neighbour] = []
    for sae, weights in decoders.items():
        rows = weights.float()
        cosines = rows @ unit / rows.norm(dim=-1).clamp_min(1e-12)
        if exclude is not None and exclude[0] == sae:
            cosines[exclude[1]] = -2.0
        best = cosines.topk(min(k, cosines.numel()))
        found += [Neighbour(sae, int(i), round(float(v), 4)) for v, i in zip(best.values, best.indices) if v > -2]
    return sorted(found, key=lambda n: -n.cosine)[:k]
