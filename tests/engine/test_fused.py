"""Fused projections (``millm.engine.fused``): a Llama model's q/k/v and gate/up multiplied as one product each give
exactly the unfused model's logits, packed for oneDNN and in int8, through HF's own cache and through the engine's;
hooks on the decoder layers still fire; other architectures are left alone."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.engine.test_packed import tiny_llama


def prepared(model: Any, fuse: bool, weights: str) -> Any:
    """A copy of ``model`` prepared as the loader prepares a CPU model: fused (or not), then int8 or packed."""
    from millm.engine.fused import fuse_layers
    from millm.engine.packed import pack_linears
    from millm.engine.weights import quantize_layers

    model = copy.deepcopy(model)
    if fuse:
        assert fuse_layers(model) == model.config.num_hidden_layers
    if weights == "int8":
        quantize_layers(model)
    pack_linears(model)
    return model


@pytest.mark.parametrize("weights", ["dtype", "int8"])
def test_fused_projections_give_exactly_the_unfused_logits_and_greedy_tokens(weights):
    import torch

    from millm.engine.packed import can_pack
    from millm.engine.weights import can_quantize

    if not can_pack() or (weights == "int8" and not can_quantize()):
        pytest.skip("this torch build cannot pack or quantize")
    base = tiny_llama(tied=True)
    plain, fused = prepared(base, False, weights), prepared(base, True, weights)
    ids = torch.tensor([[5, 17, 33, 2, 90, 41], [7, 7, 1, 60, 3, 12]])
    with torch.inference_mode():
        assert torch.equal(fused(ids).logits, plain(ids).logits)
        a = plain.generate(ids[:1], max_new_tokens=12, do_sample=False, pad_token_id=0)
        b = fused.generate(ids[:1], max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(a, b)  # HF's own cache, one token a step, through the fused layers
    attn, mlp = fused.model.layers[0].self_attn, fused.model.layers[0].mlp
    assert not hasattr(attn, "q_proj") and not hasattr(mlp, "up_proj")
    assert (attn.qkv_proj.out_features, mlp.gate_up_proj.out_features) == (32 + 16 + 16, 2 * 64)


def test_a_forward_hook_on_a_fused_decoder_layer_sees_and_changes_its_output():
    import torch

    base = tiny_llama(tied=False)
    fused = prepared(base, True, "dtype")
    seen: list[torch.Tensor] = []

    def hook(module: Any, args: Any, output: Any) -> Any:
        seen.append(output.detach().clone())
        return output + 1.0

    ids = torch.tensor([[3, 4, 5]])
    with torch.inference_mode():
        before = fused(ids).logits
        handle = fused.model.layers[1].register_forward_hook(hook)
        after = fused(ids).logits
        handle.remove()
    assert len(seen) == 1 and seen[0].shape == (1, 3, 32)
    assert not torch.equal(before, after)


def test_a_layer_of_another_architecture_is_left_as_it_is():
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from millm.engine.fused import fuse_layers

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2))
    assert fuse_layers(model) == 0
    assert hasattr(model.model.layers[0].self_attn, "q_proj")


@pytest.mark.model
def test_the_bundled_model_loads_with_its_projections_fused(engine):
    layers = engine.model.model.layers
    assert all(hasattr(layer.self_attn, "qkv_proj") and hasattr(layer.mlp, "gate_up_proj") for layer in layers)
    hidden = engine.model.config.hidden_size
    assert layers[0].self_attn.qkv_proj.out_features == hidden + 2 * 3 * 64  # 9 query heads, 3 key and value heads
