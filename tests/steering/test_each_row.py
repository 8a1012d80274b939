"""Per-row steering for teacher-forced reads (the screen's estimate), on a tiny random Llama: each row gets its
own delta, and nothing else changes."""

import pytest

from tests.steering.tiny import D, prompt_ids
from tests.support.saes import random_sae


def logits(model, ids):
    import torch

    with torch.inference_mode():
        return model(ids).logits


def test_each_row_steers_each_row_by_its_own_values_only(model):
    import torch

    from millm.steering.controller import RequestSteering, Steering

    steering = Steering(model)
    steering.attach("sae", random_sae(D, 64), layer=1)
    steering.set_values("sae", {2: 3.0}, merge=False)  # the live values: steer no row of the block
    steering.reserve_rows(2)
    steering.bind_row(1, RequestSteering("in-flight", {"sae": {9: -4.0}}))  # a request's row, between two steps
    held = steering.attachments["sae"].rows[1].clone()
    alone = {}
    for values in ({5: 6.0}, {7: -2.0, 11: 1.5}, {}):
        with steering.each_row([RequestSteering("alone", {"sae": values})]):
            alone[tuple(values)] = logits(model, prompt_ids())[0]
    rows = [RequestSteering("a", {"sae": {5: 6.0}}), RequestSteering("b", {"sae": {7: -2.0, 11: 1.5}}),
            RequestSteering("c", {})]
    with steering.each_row(rows):
        together = logits(model, prompt_ids().repeat(3, 1))
    assert torch.allclose(together[0], alone[(5,)], atol=1e-5)
    assert torch.allclose(together[1], alone[(7, 11)], atol=1e-5)
    assert torch.allclose(together[2], alone[()], atol=1e-5)  # no values: unsteered, the live ones not added
    att = steering.attachments["sae"]
    assert att.values == {2: 3.0} and torch.equal(att.rows[1], held)  # the live values and the request's row
    assert att.row_steering == {1} and set(steering._row_sources) == {1}  # the block's rows are released


def test_each_row_with_an_index_the_sae_lacks_releases_every_row(model):
    from millm.steering.controller import RequestSteering, Steering

    steering = Steering(model)
    steering.attach("sae", random_sae(D, 64), layer=1)
    with pytest.raises(IndexError):
        with steering.each_row([RequestSteering("ok", {"sae": {3: 1.0}}), RequestSteering("bad", {"sae": {64: 1.0}})]):
            pass
    assert not steering._row_sources and not steering.attachments["sae"].row_steering
