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

The layer's forward is HF's own (``LlamaDecoderLayer``, ``LlamaAttention``, ``LlamaMLP``) written once more
without the module calls between the norms, projections and activation: the same operations in the same order,
HF's rotary and attention functions called as HF calls them. It is installed on the layer object, so forward
hooks on the decoder layer (steering, read-outs, SAE activations) fire as before. A model of another architecture
is left as it is.
"""

from __future__ import annotations

from types import MethodType
from typing import Any

import torch
from torch import nn

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
    for module, names in ((attn, ("q_proj", "k_proj", "v_proj")), (mlp, ("gate_proj", "up_proj"))):
        for name in names:
            delattr(module, name)
    layer.forward = MethodType(decoder_layer_forward, layer)


def attention(attn: Any, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
              attention_mask: Any, cache: Any, kwargs: dict[str, Any]) -> torch.Tensor:
    """``LlamaAttention.forward``'s output, its q, k and v from one product."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, eager_attention_forward

    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, attn.head_dim)
    query, key, value = attn.qkv_proj(hidden_states).split(attn.qkv_sizes, dim=-1)
    query_states = query.view(hidden_shape).transpose(1, 2)
    key_states = key.view(hidden_shape).transpose(1, 2)
    value_states = value.view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
    if cache is not None:
        key_states, value_states = cache.update(key_states, value_states, attn.layer_idx, kwargs=kwargs)
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation, eager_attention_forward)
    out, _ = interface(attn, query_states, key_states, value_states, attention_mask,
                       dropout=0.0 if not attn.training else attn.attention_dropout, scaling=attn.scaling, **kwargs)
    out = out.reshape(*input_shape, -1).contiguous()
    return attn.o_proj(out)


def mlp_forward(mlp: Any, x: torch.Tensor) -> torch.Tensor:
    """``LlamaMLP.forward``'s output, its gate and up from one product."""
    gate, up = mlp.gate_up_proj(x).split(mlp.gate_up_sizes, dim=-1)
    return mlp.down_proj(mlp.act_fn(gate) * up)


def decoder_layer_forward(self: Any, hidden_states: torch.Tensor, attention_mask: Any = None,
                          position_ids: torch.Tensor | None = None, cache: Any = None, use_cache: bool | None = False,
                          position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                          **kwargs: Any) -> torch.Tensor:
    """``LlamaDecoderLayer.forward`` over the fused projections (HF's ``past_key_values`` is still ``cache``)."""
    if cache is None:
        cache = kwargs.pop("past_key_values", None)
    assert position_embeddings is not None, "Llama layers are given their rotary embeddings by the model"
    residual = hidden_states
    hidden_states = self.input_layernorm.forward(hidden_states)
    hidden_states = attention(self.self_attn, hidden_states, position_embeddings, attention_mask, cache,
                              {"position_ids": position_ids, "use_cache": use_cache, **kwargs})
    hidden_states = residual + hidden_states
    residual = hidden_states
    hidden_states = self.post_attention_layernorm.forward(hidden_states)
    return residual + mlp_forward(self.mlp, hidden_states)
