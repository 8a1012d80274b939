"""The decode loop's lean forward (``millm.engine.lean``) over the lean decoder layers (``millm.engine.fused``): through
the engine's slot cache, a merged prefill and one-token decode steps give exactly the logits of HF's own forward over
HF's own layers; other calls go to HF's forward; with int8 weights the decode loop samples from an int8 copy of the
output projection, a row's logits its own in a batch, while every other forward keeps the fp32 projection."""

from __future__ import annotations

from typing import Any

import pytest

from tests.engine.test_fused import prepared
from tests.engine.test_packed import tiny_llama


def lean(model: Any, weights: str) -> Any:
    """``model`` prepared as the loader prepares a CPU Llama model: fused, lean forward, then int8 or packed."""
    from millm.engine.lean import install
    from millm.engine.weights import quantize_sampling_head

    model = prepared(model, True, weights)
    assert install(model)
    if weights == "int8":
        quantize_sampling_head(model)
    return model


def steps(model: Any, rows: int) -> list[Any]:
    """The kept logits of a prompt prefilled in one forward over ``rows`` slots, then three one-token decode steps,
    through a fresh slot cache."""
    import torch

    from millm.engine.decode.kv import KVShape, SlotCache

    cache = SlotCache(KVShape.of(model.config), rows, 64, torch.float32, torch.device("cpu"))
    ids = torch.tensor([[5, 17, 33, 2, 90, 41], [7, 7, 1, 60, 3, 12]])[:rows]
    positions = torch.arange(6).repeat(rows, 1)
    out = []
    with torch.inference_mode():
        for step in range(4):
            mask = cache.bind(0, positions)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                           logits_to_keep=1).logits[:, -1, :]
            out.append(logits)
            ids, positions = logits.argmax(-1, keepdim=True), torch.full((rows, 1), 6 + step)
    return out


@pytest.mark.parametrize("rows", [1, 2])
def test_the_lean_forward_gives_exactly_hf_logits_through_the_slot_cache(rows):
    import torch

    from millm.engine.packed import can_pack

    if not can_pack():
        pytest.skip("this torch build cannot pack")
    base = tiny_llama(tied=True)
    assert base.config._attn_implementation == "sdpa"  # the one-token step's own SDPA call is what is compared
    hf, ours = steps(prepared(base, False, "dtype"), rows), steps(lean(base, "dtype"), rows)
    assert all(torch.equal(a, b) for a, b in zip(hf, ours))


def test_other_calls_go_to_hf_forward():
    import torch

    from millm.engine.lean import StepOutput

    model = lean(tiny_llama(tied=False), "dtype")
    with torch.inference_mode():
        out = model(torch.tensor([[3, 4, 5]]))
    assert not isinstance(out, StepOutput) and out.logits.shape == (1, 3, 96)


def test_int8_decode_samples_from_the_int8_output_projection_alone():
    import torch

    from millm.engine.lean import install
    from millm.engine.weights import Int8Linear, can_quantize

    if not can_quantize():
        pytest.skip("this torch build cannot quantize")
    base = tiny_llama(tied=True)
    model = lean(base, "int8")
    assert isinstance(model.sampling_head, Int8Linear) and not isinstance(model.lm_head, Int8Linear)
    without = prepared(base, True, "int8")  # the same model with no int8 head: its projection is the fp32 one
    assert install(without)
    ids = torch.tensor([[5, 17, 33, 2, 90, 41]])
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, without(ids).logits)  # HF's forward (scoring) keeps the fp32 one
    alone, batched, fp32_head = steps(model, 1), steps(model, 2), steps(without, 1)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(alone, batched))  # a row's logits are its own
    assert not torch.equal(alone[0], fp32_head[0]) and torch.allclose(alone[0], fp32_head[0], atol=0.05)


@pytest.mark.parametrize("weights", ["dtype", "int8"])
def test_hooks_on_the_embedding_final_norm_and_output_projection_see_every_decode_step(weights):
    import torch

    from millm.engine.weights import can_quantize

    if weights == "int8" and not can_quantize():
        pytest.skip("this torch build cannot quantize")
    base = tiny_llama(tied=True)
    model, plain = lean(base, weights), lean(base, weights)
    seen: dict[str, list[torch.Tensor]] = {"embed": [], "norm": [], "head": []}
    modules = {"embed": model.model.embed_tokens, "norm": model.model.norm, "head": model.lm_head}
    hooks = [module.register_forward_hook(lambda m, args, out, k=k: seen[k].append(out.detach().clone()))
             for k, module in modules.items()]
    try:
        hooked = steps(model, 1)
    finally:
        for hook in hooks:
            hook.remove()
    assert all(len(outs) == 4 for outs in seen.values())  # the prefill and three decode steps, each hook every one
    assert all(torch.equal(a, b[:, -1, :]) for a, b in zip(hooked, seen["head"]))  # what was sampled is what it saw
    unhooked = steps(plain, 1)
    if weights == "dtype":  # in fp32 a hook changes nothing; in int8 it moves sampling to the projection it hooks
        assert all(torch.equal(a, b) for a, b in zip(hooked, unhooked))
