"""Hook algebra on a tiny random Llama: the delta lands exactly where and when it should."""

import pytest

from millm.errors import InvalidFeatureIndex, InvalidParameter, SAENotAttached
from millm.steering.values import STRENGTH_LIMIT, clamp, parse_assignments
from tests.steering.tiny import D, as_scheduled, prompt_ids
from tests.support.saes import random_sae


def layer_outputs(model, ids, steering=None, view=None):
    """Each decoder layer's output, recorded by hooks that run after any steering hook; with ``steering``, the
    forward runs as the scheduler runs one: row 0 bound to the live values, under a row view."""
    import torch

    outs = []
    handles = [layer.register_forward_hook(lambda m, a, o: outs.append((o[0] if isinstance(o, tuple) else o).clone()))
               for layer in model.model.layers]
    try:
        with torch.inference_mode():
            if steering is None:
                model(ids)
            elif view is not None:
                steering.reserve_rows(1)
                steering.bind_row(0, None)
                with steering.rows(view):
                    model(ids)
                steering.release_row(0)
            else:
                with as_scheduled(steering, ids.shape[0]):
                    model(ids)
    finally:
        for h in handles:
            h.remove()
    return outs




def test_delta_added_at_layer_only(model):
    import torch

    from millm.steering.controller import Steering

    base = layer_outputs(model, prompt_ids())
    steering = Steering(model)
    sae = random_sae(D, 64)
    steering.attach("sae_a", sae, layer=2)
    # no values: no-op
    assert all(torch.equal(a, b) for a, b in zip(layer_outputs(model, prompt_ids(), steering), base))
    steering.set_values("sae_a", {"3": 5.0, 10: -2.5}, merge=False)
    steered = layer_outputs(model, prompt_ids(), steering)
    delta = 5.0 * sae.W_dec[3] - 2.5 * sae.W_dec[10]
    assert torch.equal(steered[0], base[0]) and torch.equal(steered[1], base[1])  # earlier layers bit-identical
    assert torch.allclose(steered[2], base[2] + delta, atol=1e-6)  # every position gets the delta
    assert not torch.allclose(steered[3], base[3])
    # outside the scheduler: none
    assert all(torch.equal(a, b) for a, b in zip(layer_outputs(model, prompt_ids()), base))
    steering.set_enabled(False)
    assert all(torch.equal(a, b) for a, b in zip(layer_outputs(model, prompt_ids(), steering), base))
    steering.set_enabled(True)
    steering.detach("sae_a")
    assert all(torch.equal(a, b) for a, b in zip(layer_outputs(model, prompt_ids(), steering), base))
    assert not model.model.layers[2]._forward_hooks


def test_delta_buffer_is_updated_in_place(model):
    import torch

    from millm.steering.controller import Steering

    steering = Steering(model)
    att = steering.attach("sae_a", random_sae(D, 64), layer=1)
    buffer = att.delta
    pointer = buffer.data_ptr()
    steering.set_values("sae_a", {1: 3.0}, merge=False)
    steering.set_values("sae_a", {2: 4.0}, merge=True)
    assert att.delta is buffer and buffer.data_ptr() == pointer
    assert torch.allclose(buffer, 3.0 * att.sae.W_dec[1] + 4.0 * att.sae.W_dec[2])
    steering.set_values("sae_a", {1: 0.0}, merge=True)  # 0 removes in a merge
    assert att.values == {2: 4.0}
    steering.clear()
    assert torch.count_nonzero(buffer) == 0


def test_strengths_clamped_at_apply_time(model):
    import torch

    from millm.steering.controller import Steering

    steering = Steering(model)
    att = steering.attach("sae_a", random_sae(D, 64), layer=0)
    steering.set_values("sae_a", {7: 1000.0}, merge=False)
    assert att.values == {7: 1000.0}
    assert torch.allclose(att.delta, STRENGTH_LIMIT * att.sae.W_dec[7])
    assert clamp(-500) == -STRENGTH_LIMIT and clamp(12.5) == 12.5


def test_several_saes_and_suppression(model):
    import torch

    from millm.steering.controller import Steering

    base = layer_outputs(model, prompt_ids())
    steering = Steering(model)
    a, b = random_sae(D, 64, seed=1), random_sae(D, 32, seed=2)
    steering.attach("sae_a", a, layer=0)
    steering.attach("sae_b", b, layer=3)
    steering.set_values("sae_a", {0: 2.0}, merge=False)
    steering.set_values("sae_b", {1: 3.0}, merge=False)
    steered = layer_outputs(model, prompt_ids(), steering)
    assert not torch.allclose(steered[0], base[0]) and not torch.allclose(steered[3], base[3])
    with steering.suppressed():
        assert all(torch.equal(x, y) for x, y in zip(layer_outputs(model, prompt_ids(), steering), base))
    assert all(torch.equal(x, y) for x, y in zip(layer_outputs(model, prompt_ids(), steering), steered))


def test_a_requests_own_row_keeps_the_base_and_operator_wins(model):
    import torch

    from millm.steering.controller import RequestSteering, Steering

    steering = Steering(model)
    att = steering.attach("sae_a", random_sae(D, 64), layer=1)
    steering.set_values("sae_a", {1: 2.0}, merge=False)
    steering.reserve_rows(2)
    base_delta = att.delta.clone()
    steering.bind_row(0, RequestSteering("p", {"sae_a": {5: 9.0}}))  # a request with its own profile
    steering.bind_row(1, None)  # a request on the live values
    assert att.rows is not None and not steering.live
    assert torch.allclose(att.rows[0], 9.0 * att.sae.W_dec[5]) and torch.equal(att.rows[1], base_delta)
    assert torch.equal(att.delta, base_delta)  # the base is never displaced
    steering.set_values("sae_a", {6: 1.0}, merge=False)  # operator acts mid-request
    assert torch.allclose(att.rows[0], 9.0 * att.sae.W_dec[5])  # the request keeps its profile
    assert torch.allclose(att.rows[1], 1.0 * att.sae.W_dec[6])  # the live row follows the operator
    steering.release_row(0)
    assert steering.live and torch.allclose(att.delta, 1.0 * att.sae.W_dec[6])  # and nothing was undone
    assert torch.count_nonzero(att.rows[0]) == 0


def test_reserving_more_rows_keeps_the_bound_ones(model):
    import torch

    from millm.steering.controller import RequestSteering, Steering

    steering = Steering(model)
    att = steering.attach("sae_a", random_sae(D, 64), layer=1)
    steering.reserve_rows(1)
    steering.bind_row(0, RequestSteering("p", {"sae_a": {5: 9.0}}))
    steering.reserve_rows(3)
    assert att.rows is not None and att.rows.shape[0] == 3
    assert torch.allclose(att.rows[0], 9.0 * att.sae.W_dec[5]) and torch.count_nonzero(att.rows[1:]) == 0


def test_row_readers_see_the_residual_before_and_after_the_delta(model):
    import torch

    from millm.steering.controller import RowView, Steering

    steering = Steering(model)
    att = steering.attach("sae_a", random_sae(D, 64), layer=2)
    steering.set_values("sae_a", {4: 3.0}, merge=False)
    seen = {}
    view = RowView(0, 1, readers={"sae_a": [(0, lambda h: seen.setdefault("pre", h.clone()))]},
                   post={"sae_a": [(0, lambda h: seen.setdefault("post", h.clone()))]})
    layer_outputs(model, prompt_ids(), steering, view)
    assert torch.allclose(seen["post"], seen["pre"] + att.delta)


def test_unsteered_readers_read_suppressed_passes_only(model):
    import torch

    from millm.steering.controller import Steering

    steering = Steering(model)
    att = steering.attach("sae_a", random_sae(D, 64), layer=2)
    steering.set_values("sae_a", {4: 3.0}, merge=False)
    seen: list[torch.Tensor] = []
    with steering.reading_unsteered("sae_a", seen.append):
        layer_outputs(model, prompt_ids(), steering)  # a steered forward: not read
        with steering.suppressed():
            layer_outputs(model, prompt_ids())
    assert len(seen) == 1 and torch.allclose(seen[0], layer_outputs(model, prompt_ids())[2])
    assert not att.unsteered_readers


def test_refusals(model):
    from millm.steering.controller import Steering

    steering = Steering(model)
    with pytest.raises(InvalidParameter, match="d_in"):
        steering.attach("sae_x", random_sae(D + 1, 8), layer=0)
    with pytest.raises(InvalidParameter, match="layer"):
        steering.attach("sae_x", random_sae(D, 8), layer=9)
    steering.attach("sae_a", random_sae(D, 8), layer=0)
    with pytest.raises(InvalidParameter, match="already has SAE sae_a"):
        steering.attach("sae_b", random_sae(D, 8), layer=0)
    with pytest.raises(InvalidFeatureIndex, match="outside"):
        steering.set_values("sae_a", {8: 1.0}, merge=False)
    with pytest.raises(InvalidParameter, match="finite number"):
        steering.set_values("sae_a", {1: "strong"}, merge=False)
    with pytest.raises(SAENotAttached):
        steering.set_values("sae_zzz", {1: 1.0}, merge=False)
    assert steering.attachments["sae_a"].values == {}  # nothing half-applied
    assert parse_assignments(["12=40", "3=-2.5"]) == {12: 40.0, 3: -2.5}
    with pytest.raises(InvalidParameter):
        parse_assignments(["12:40"])


def test_detach_all_leaves_no_hook(model):
    from millm.steering.controller import Steering

    steering = Steering(model)
    steering.attach("sae_a", random_sae(D, 8), layer=0)
    steering.attach("sae_b", random_sae(D, 8), layer=1)
    steering.detach_all()
    assert not any(layer._forward_hooks for layer in model.model.layers)
