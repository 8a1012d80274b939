"""Linear layers on the CPU through oneDNN, their weights packed once when the model loads.

``nn.Linear`` hands its weight to the BLAS in the plain layout on every call. oneDNN (part of every x86 build
of torch) can reorder a weight once into the blocked layout its kernels read and then multiply straight from
it: on 2 Zen 2 cores with the bundled model's shapes that is 1.2-1.5x faster for the decoder's projections and
about 1.9x for the 49,152-token output projection (``bench/packed.py``). A packed product is also the same
for a row whatever rows it is computed beside, which the BLAS path is not for a few rows.

Every forward of the engine (generation, scoring, reads) runs on the packed weights. A dense weight that is
also another module's (tied input and output embeddings) stays as it is; the others are dropped, and given
back unpacked to whatever still asks a layer for its ``weight``. A weight is read once, when it is packed:
changing a dense weight in place afterwards does not reach the products.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)


class PackedLinear(nn.Module):
    """``linear`` with its weight in oneDNN's packed layout: the same product, computed from that layout."""

    def __init__(self, linear: nn.Linear, keep_dense: bool) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach())
        self.bias = linear.bias
        self.dense = linear.weight if keep_dense else None

    @property
    def weight(self) -> torch.Tensor:
        """The dense weight: the one kept (shared with another module), else unpacked (a copy)."""
        return self.dense if self.dense is not None else self.packed.to_dense()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.requires_grad:  # oneDNN's packed product has no gradient
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN"


def can_pack() -> bool:
    """Whether this torch build packs and multiplies fp32 weights with oneDNN (a tiny product is tried)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        probe = PackedLinear(nn.Linear(8, 4), keep_dense=False)
        x = torch.ones(2, 8)
        return bool(torch.allclose(probe(x), F.linear(x, probe.weight, probe.bias), atol=1e-5))
    except (RuntimeError, AttributeError):
        return False


def pack_linears(model: Any) -> int:
    """Every fp32 ``nn.Linear`` of a CPU model replaced by a :class:`PackedLinear` (in place); how many were.
    Nothing is changed where this torch cannot pack."""
    if not can_pack():
        log.info("oneDNN cannot pack weights in this torch build: linear layers multiply as they are")
        return 0
    linears = {name: m for name, m in model.named_modules() if type(m) is nn.Linear
               and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"}
    owners: dict[int, int] = {}
    for _, module in model.named_modules(remove_duplicate=False):
        for param in module.parameters(recurse=False):
            owners[id(param)] = owners.get(id(param), 0) + 1
    for name, linear in linears.items():
        parent, _, child = name.rpartition(".")
        holder = model.get_submodule(parent) if parent else model
        setattr(holder, child, PackedLinear(linear, keep_dense=owners[id(linear.weight)] > 1))
    return len(linears)
