"""Fused projections and a leaner decoder layer for Llama-family models on the CPU.

Three projections of a Llama attention block read the same input (q, k, v), and two of its MLP's (gate, up). Each
group is multiplied here as one product over its weights concatenated, so a decoder layer makes four products a
token instead of seven: on 2 Zen 2 cores, 30 layers of the bundled model's products take 20.3-20.6 ms instead of
21.9-25.9 ms in fp32 (oneDNN, packed) and 7.7-8.0 ms instead of 11.5-11.6 ms in int8, the weights streamed from
memory as in decoding. The products stay exactly what they were: oneDNN's packed product splits a weight's outputs
into blocks and sums each output over its inputs in the same order whatever the block (``torch.equal`` on the
bundled model's shapes, 1 to 64 rows), and int8's products are integer sums under the same per-channel and
per-row scales. Greedy answers, steering and read-outs are byte-identical to the unfused model
(``tests/engine/test_fused.py``; ``bench/same_answers.py`` against the checkout before).

The layer's forward is HF's (``LlamaDecoderLayer``, ``LlamaAttention``, ``LlamaMLP``) written once more with the
same arithmetic and fewer operations around it (about 60 aten calls a layer in an int8 decode step instead of 97,
``bench/step_ops.py``): the positions are rows of one ``[B*T, hidden]`` matrix, so the products take them without
reshapes; the norms are ``torch.rms_norm`` (exactly HF's fp32 values in one call); the queries and keys are
rotated together in the product's own layout, ``rotate_half``'s slices and concatenation replaced by a ``roll``
and a sign folded into ``sin`` once a step (``rotary``); the engine's slot cache takes the keys and values in that
layout; a one-token step calls SDPA as HF's ``sdpa_attention_forward`` does. It is installed on the layer object,
so forward hooks on the decoder layer (steering, read-outs, SAE activations) fire as before. A model of another
architecture is left as it is. It runs only on the CPU in fp32 (where the loader fuses).
"""

from __future__ import annotations

from types import MethodType
from typing import Any

import torch
from torch import nn

from millm.engine.decode.kv import SlotCache

LLAMA = ("LlamaDecoderLayer", "LlamaAttention", "LlamaMLP")


def fusable(layer: nn.Module) -> bool:
    """Whether ``layer`` is a Llama decoder layer with its projections as plain ``nn.Linear``."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if (type(layer).__name__, type(attn).__name__, type(mlp).__name__) != LLAMA:
        return False
    parts = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj")]
    parts += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj")]
    return all(type(p) is nn.Linear for p in parts)


def concatenated(linears: list[nn.Linear]) -> nn.Linear:
    """One ``nn.Linear`` whose outputs are ``linears``' outputs side by side (weights and biases concatenated)."""
    first = linears[0]
    fused = nn.Linear(first.in_features, sum(p.out_features for p in linears), bias=first.bias is not None,
                      dtype=first.weight.dtype, device=first.weight.device)
    with torch.no_grad():
        fused.weight = nn.Parameter(torch.cat([p.weight.detach() for p in linears]), requires_grad=False)
        if first.bias is not None:
            fused.bias = nn.Parameter(torch.cat([p.bias.detach() for p in linears if p.bias is not None]),
                                      requires_grad=False)
    return fused


def fuse_layers(model: Any) -> int:
    """Every Llama decoder layer of ``model`` given fused q/k/v and gate/up projections and the lean forward (in
    place); how many were. Other layers are left as they are."""
    layers = getattr(model, model.base_model_prefix).layers
    done = 0
    for layer in layers:
        if fusable(layer):
            _fuse(layer)
            done += 1
    return done


def _fuse(layer: Any) -> None:
    attn, mlp = layer.self_attn, layer.mlp
    qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
    attn.qkv_sizes = [p.out_features for p in qkv]
    attn.qkv_proj = concatenated(qkv)
    gate_up = [mlp.gate_proj, mlp.up_proj]
    mlp.gate_up_sizes = [p.out_features for p in gate_up]
    mlp.gate_up_proj = concatenated(gate_up)
    _fuse_attention_shape(attn)
    for module, names in ((attn, ("q_proj", "k_proj", "v_proj")), (mlp, ("gate_proj", "up_proj"))):
        for name in names:
            delattr(module, name)
    layer.forward = MethodType(decoder_layer_forward, layer)


def _fuse_attention_shape(attn: Any) -> None:
    """The head counts the lean attention splits its fused product by."""
    q, k, _ = attn.qkv_sizes
    attn.q_heads, attn.kv_heads = q // attn.head_dim, k // attn.head_dim


_rotary: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (HF's sin, cos for [B,T,H,D], signed sin)


def rotary(position_embeddings: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's ``(cos, sin)`` (``[B, T, D]``) as the lean forward multiplies by them, ``[B, T, 1, D]``: ``cos``, and
    ``sin`` with its first half negated, so that ``x * cos + roll(x, D/2) * signed`` is HF's
    ``x * cos + rotate_half(x) * sin`` exactly (``-a * b == a * -b`` in IEEE arithmetic). Every layer of a forward
    is given the same tensors: they are made once and kept for the next layer (one pair held at a time)."""
    global _rotary
    cos, sin = position_embeddings
    held = _rotary
    if held is not None and held[0] is sin:
        return held[1], held[2]
    half = sin.shape[-1] // 2
    signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1).unsqueeze(2)
    made = (sin, cos.unsqueeze(2), signed)
    _rotary = made
    return made[1], made[2]


def attention(attn: Any, x: torch.Tensor, shape: tuple[int, int],
              position_embeddings: tuple[torch.Tensor, torch.Tensor], attention_mask: Any, cache: Any,
              kwargs: dict[str, Any]) -> torch.Tensor:
    """``LlamaAttention.forward``'s output for ``x`` (``[B*T, hidden]``), its q, k and v from one product.

    The queries and keys are rotated together, in the product's own ``[B, T, heads, D]`` layout (no transposes,
    no ``rotate_half`` slices and concatenations); the engine's slot cache takes the keys and values in that
    layout (``SlotCache.write``), any other cache HF's ``update``. A one-token step through SDPA calls it as HF's
    ``sdpa_attention_forward`` does for one query (the grouped heads packed as queries, ``pack_gqa``); everything
    else goes through HF's attention function."""
    batch, length = shape
    dim, q_heads, kv_heads = attn.head_dim, attn.q_heads, attn.kv_heads
    qkv = attn.qkv_proj.forward(x)
    width = (q_heads + kv_heads) * dim
    qk = qkv[:, :width].view(batch, length, q_heads + kv_heads, dim)
    value = qkv[:, width:].view(batch, length, kv_heads, dim)
    cos, signed = rotary(position_embeddings)
    qk = qk * cos + qk.roll(dim // 2, -1) * signed
    key = qk[:, :, q_heads:]
    implementation = attn.config._attn_implementation
    if isinstance(cache, SlotCache):
        keys, values = cache.write(attn.layer_idx, key, value)
        one_mask = isinstance(attention_mask, torch.Tensor) and attention_mask.shape[1] == 1  # for every head
        if length == 1 and implementation == "sdpa" and one_mask:
            query = qk[:, 0, :q_heads].view(batch, kv_heads, q_heads // kv_heads, dim)
            out = torch.nn.functional.scaled_dot_product_attention(query, keys, values, attn_mask=attention_mask,
                                                                   dropout_p=0.0, scale=attn.scaling)
            return attn.o_proj.forward(out.view(batch, -1))
    elif cache is not None:
        keys, values = cache.update(key.transpose(1, 2), value.transpose(1, 2), attn.layer_idx, kwargs=kwargs)
    else:
        keys, values = key.transpose(1, 2), value.transpose(1, 2)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.llama.modeling_llama import eager_attention_forward

    interface = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
    out, _ = interface(attn, qk[:, :, :q_heads].transpose(1, 2), keys, values, attention_mask,
                       dropout=0.0 if not attn.training else attn.attention_dropout, scaling=attn.scaling, **kwargs)
    return attn.o_proj.forward(out.reshape(batch * length, -1))


def norm(module: Any, x: torch.Tensor) -> torch.Tensor:
    """``LlamaRMSNorm.forward(x)`` for an fp32 ``x``: ``torch.rms_norm`` gives exactly its values in fp32 (the same
    mean of squares, reciprocal square root and products) in one call instead of eight."""
    return torch.rms_norm(x, module.weight.shape, module.weight, module.variance_epsilon)


def mlp_forward(mlp: Any, x: torch.Tensor) -> torch.Tensor:
    """``LlamaMLP.forward``'s output, its gate and up from one product."""
    gate, up = mlp.gate_up_proj.forward(x).split(mlp.gate_up_sizes, dim=-1)
    return mlp.down_proj.forward(mlp.act_fn.forward(gate) * up)


def decoder_layer_forward(self: Any, hidden_states: torch.Tensor, attention_mask: Any = None,
                          position_ids: torch.Tensor | None = None, cache: Any = None, use_cache: bool | None = False,
                          position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                          **kwargs: Any) -> torch.Tensor:
    """``LlamaDecoderLayer.forward`` over the fused projections, the positions as rows of one ``[B*T, hidden]``
    matrix (HF's ``past_key_values`` is still ``cache``)."""
    if cache is None:
        cache = kwargs.pop("past_key_values", None)
    assert position_embeddings is not None, "Llama layers are given their rotary embeddings by the model"
    shape = hidden_states.shape
    residual = hidden_states.reshape(-1, shape[-1])
    hidden = attention(self.self_attn, norm(self.input_layernorm, residual), (shape[0], shape[1]),
                       position_embeddings, attention_mask, cache,
                       {"position_ids": position_ids, "use_cache": use_cache, **kwargs})
    residual = residual + hidden
    return (residual + mlp_forward(self.mlp, norm(self.post_attention_layernorm, residual))).view(shape)
