"""8-bit weights for the transformers engine on the CPU (``MILLM_WEIGHTS=int8``, ``--weights int8``).

Every ``nn.Linear`` of the decoder layers (attention q, k, v, o; the MLP's gate, up, down) is replaced by an
:class:`Int8Linear`: its weight quantised once, symmetric, one scale per output channel, and prepacked for
FBGEMM (torch's x86 quantized backend); each product multiplies 8-bit activations by those 8-bit weights in
FBGEMM's integer kernel and comes back in fp32. Everything else stays fp32: the embeddings, the norms, the
attention itself, the residual stream (so SAE hooks, steering deltas, read-outs and SAE encode/decode see fp32
and mean what they mean in fp32), the KV cache, and the output projection (``lm_head``, tied to the input
embeddings: its fp32 weight is in memory either way, and the logits that scoring, log-probs and read-outs
report come from it; it is packed for oneDNN by ``millm.engine.packed``). The decode loop samples its tokens
from an int8 copy of that projection (``quantize_sampling_head``), a quarter of the bytes a step reads for it.

The activations are quantised per token, not per tensor: each row of the input gets its own scale (its largest
magnitude over 63, 7-bit levels around a zero point of 64, FBGEMM's ``reduce_range`` so the AVX2 kernel's 16-bit
pair sums cannot saturate). torch's dynamic quantization (``quantize_dynamic``) takes one scale for the whole
input, so a row's product would depend on the rows and padding computed beside it; here the integer product of a
row is exact and its scale its own, so a row's answer is the same alone, in a batch or in a longer prefill (the
engine's promise: ``tests/engine/test_int8_weights.py``). The kernel is torch's
``quantized::linear_with_input_q_dq_qweight_dq_output_fp32`` given the row-scaled input at scale 1; miLLM only
picks the scales.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

LEVELS = 63  # activation levels on each side of the zero point: 7 bits (FBGEMM's reduce_range on AVX2)
ZERO_POINT = 64  # quint8's zero point for a row scaled into [-63, 63]
WEIGHT_LEVELS = 127  # qint8 weights, symmetric
TINY = 1e-12  # the scale of an all-zero row or channel (its products are 0 either way)

INT8 = "int8"
DENSE = "dtype"  # MILLM_WEIGHTS' name for weights kept in the model's dtype (millm.engine.dtypes.weights_mode)


class Int8Linear(nn.Module):
    """``linear`` with an int8 weight (per-channel scales) multiplied by per-token 8-bit activations."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().to(torch.float32)
        scales = (weight.abs().amax(dim=1) / WEIGHT_LEVELS).clamp(min=TINY).to(torch.float64)
        with warnings.catch_warnings():  # torch warns that quantized tensors are deprecated; the kernel is current
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(weight, scales, torch.zeros_like(scales, dtype=torch.long), 0,
                                                 torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(qweight, None)
        self.bias = linear.bias

    @property
    def weight(self) -> torch.Tensor:
        """The int8 weight as fp32 (a copy): what the products multiply by."""
        qweight, _ = torch.ops.quantized.linear_unpack(self.packed)
        return qweight.dequantize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.requires_grad:  # no gradient through the quantized kernel
            return F.linear(x, self.weight.to(x.dtype), self.bias)
        if x.dim() != 2:  # the lean decoder layer hands its rows as one matrix already
            return self.forward(x.reshape(-1, self.in_features)).reshape(*x.shape[:-1], self.out_features)
        step = torch.linalg.vector_norm(x, float("inf"), dim=-1, keepdim=True).clamp_(min=TINY).div_(LEVELS)
        out = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(x / step, 1.0, ZERO_POINT,
                                                                                self.packed) * step
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weights=int8 per channel"


def can_quantize() -> bool:
    """Whether this torch build multiplies int8 weights on the CPU (FBGEMM or oneDNN; a tiny product is tried)."""
    try:
        if not torch.backends.quantized.supported_engines or torch.backends.quantized.engine == "none":
            return False
        torch.manual_seed(0)
        linear = nn.Linear(16, 8)
        x = torch.randn(3, 16)
        with torch.no_grad():
            return bool(torch.allclose(Int8Linear(linear)(x), linear(x), atol=0.05))
    except (RuntimeError, AttributeError):
        return False


def quantize_layers(model: Any) -> int:
    """Every fp32 ``nn.Linear`` of the decoder layers replaced by an :class:`Int8Linear` (in place); how many were.
    The output projection and anything outside the decoder layers stay as they are."""
    layers = getattr(model, model.base_model_prefix).layers
    linears = {name: m for name, m in layers.named_modules() if type(m) is nn.Linear
               and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"}
    for name, linear in linears.items():
        parent, _, child = name.rpartition(".")
        holder = layers.get_submodule(parent) if parent else layers
        setattr(holder, child, Int8Linear(linear))
    return len(linears)


def quantize_sampling_head(model: Any) -> None:
    """``model.sampling_head``: an int8 copy of its output projection (``lm_head``, fp32 and packed as before), whose
    logits the decode loop samples from (``millm.engine.lean``): the 49,152-token projection is the largest
    weight a decode step reads, a quarter of it in int8. Scoring, log-probabilities (never taken from the decode
    loop: a request asking for them is a scoring request) and every other forward keep the fp32 projection."""
    model.sampling_head = Int8Linear(model.lm_head)


def weights_of(model: Any) -> str:
    """``int8`` when the model's decoder layers multiply int8 weights, else ``dtype`` (weights in the dtype): the
    names ``weights_mode`` plans a load with."""
    return INT8 if any(isinstance(m, Int8Linear) for m in model.modules()) else DENSE
