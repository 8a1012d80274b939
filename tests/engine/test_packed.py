"""Linear layers packed for oneDNN on the CPU: the same products as the dense layers, a row's product the same
whatever it is computed beside, tied weights kept, and the real model loaded that way."""

from __future__ import annotations

from typing import Any

import pytest


def tiny_llama(tied: bool) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("tied", [True, False])
def test_a_packed_model_gives_the_dense_models_logits(tied):
    import copy

    import torch

    from millm.engine.packed import PackedLinear, can_pack, pack_linears

    if not can_pack():
        pytest.skip("this torch build has no oneDNN packing")
    dense = tiny_llama(tied)
    packed = copy.deepcopy(dense)
    assert pack_linears(packed) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer; the output layer (unfused)
    ids = torch.tensor([[5, 17, 33, 2, 90, 41]])
    with torch.inference_mode():
        assert torch.allclose(packed(ids).logits, dense(ids).logits, atol=1e-4)
    head = packed.get_output_embeddings()
    assert isinstance(head, PackedLinear)
    assert (head.weight is packed.get_input_embeddings().weight) == tied  # a shared weight stays, the same one
    proj = packed.model.layers[0].mlp.up_proj
    assert proj.dense is None and torch.equal(proj.weight, dense.model.layers[0].mlp.up_proj.weight)


def test_a_rows_packed_product_does_not_depend_on_the_rows_beside_it():
    import torch
    from torch import nn

    from millm.engine.packed import PackedLinear, can_pack

    if not can_pack():
        pytest.skip("this torch build has no oneDNN packing")
    torch.manual_seed(0)
    layer = PackedLinear(nn.Linear(576, 1536, bias=False), keep_dense=False)
    rows = torch.randn(48, 576)
    with torch.inference_mode():
        together = layer(rows)
        assert all(torch.equal(layer(rows[:n]), together[:n]) for n in (1, 2, 7, 16))


def test_an_input_that_needs_a_gradient_is_multiplied_densely():
    import torch
    from torch import nn

    from millm.engine.packed import PackedLinear, can_pack

    if not can_pack():
        pytest.skip("this torch build has no oneDNN packing")
    linear = nn.Linear(8, 4)
    layer = PackedLinear(linear, keep_dense=False)
    x = torch.randn(3, 8, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and torch.allclose(x.grad, linear.weight.detach().sum(0).expand(3, 8))


@pytest.mark.model
def test_the_bundled_model_loads_packed_and_its_output_embedding_is_the_input_one(engine):
    from millm.engine.packed import PackedLinear

    packed = [m for m in engine.model.modules() if isinstance(m, PackedLinear)]
    assert len(packed) == 4 * engine.model.config.num_hidden_layers + 1  # qkv, o, gate-up, down (millm.engine.fused)
    assert engine.model.get_output_embeddings().weight is engine.model.get_input_embeddings().weight
