"""steering_scope's mechanics on a tiny random Llama: a row's delta is gated by the phase of each forward (prompt
or generated), per row, and the gates follow the row through binding, growing buffers, re-attaching and release;
the scope's parsing and its place in X-miLLM-Steering."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from millm.errors import InvalidParameter
from millm.names import steering_header, steering_label, steering_scope_of
from millm.steering.scope import GENERATED_PHASE, PROMPT_PHASE, SCOPES, applies, gates, parse_scope
from tests.steering.tiny import D, prompt_ids
from tests.support.saes import random_sae

if TYPE_CHECKING:
    import torch

    from millm.steering.controller import RequestSteering, Steering


def steer() -> RequestSteering:
    from millm.steering.controller import RequestSteering

    return RequestSteering("test", {"sae": {5: 8.0}})


def forward(model, steering: Steering, rows: int, phase: int | None) -> torch.Tensor:
    import torch

    from millm.steering.controller import RowView

    with torch.inference_mode(), steering.rows(RowView(0, rows, phase=phase)):
        return model(prompt_ids().repeat(rows, 1)).logits


@pytest.fixture
def steered(model):
    from millm.steering.controller import Steering

    steering = Steering(model)
    steering.attach("sae", random_sae(D, 64), layer=1)
    steering.reserve_rows(3)
    yield steering
    for slot in range(3):
        steering.release_row(slot)


def test_each_row_is_steered_only_in_the_phases_its_scope_names(model, steered):
    import torch

    with torch.inference_mode():
        plain = model(prompt_ids()).logits[0]
    for slot, scope in enumerate(SCOPES):
        steered.bind_row(slot, steer(), scope)
    for phase in (PROMPT_PHASE, GENERATED_PHASE):
        out = forward(model, steered, 3, phase)
        full = forward(model, steered, 3, None)[0]  # a research forward: every delta as it is
        for slot, scope in enumerate(SCOPES):
            expected = full if applies(scope, phase) else plain
            assert torch.allclose(out[slot], expected, atol=1e-5), (scope, phase)
        assert not torch.allclose(full, plain, atol=1e-3)  # the steering is strong enough to tell apart


def test_gates_follow_rows_through_growth_reattach_and_release(model, steered):
    steered.bind_row(1, steer(), "generated")
    steered.reserve_rows(8)  # the buffers grow: the bound row keeps its gates
    att = steered.attachments["sae"]
    assert att.gates is not None and att.gates[:, 1].tolist() == list(gates("generated"))
    steered.attach("sae", random_sae(D, 64, seed=1), layer=2)  # re-attached under the bound row
    assert steered.attachments["sae"].gates[:, 1].tolist() == [0.0, 1.0]
    assert steered.row_scope(1) == "generated"
    steered.release_row(1)
    assert steered.attachments["sae"].gates[:, 1].tolist() == [1.0, 1.0] and steered.row_scope(1) == "all"


def test_parse_scope_takes_the_three_words_and_names_the_field_otherwise():
    assert [parse_scope(s) for s in SCOPES] == list(SCOPES) and parse_scope(None) is None
    for bad in ("ALL", "decode", 1, True, ["all"]):
        with pytest.raises(InvalidParameter, match="steering_scope") as caught:
            parse_scope(bad)
        assert caught.value.param == "steering_scope"


@pytest.mark.parametrize("label", ["live", "weather", 'od"d;name', "live "])
@pytest.mark.parametrize("scope", SCOPES)
def test_the_steering_header_reports_a_partial_scope_and_reads_back(label, scope):
    header = steering_header(label, scope)
    assert steering_label(header) == label and steering_scope_of(header) == scope
    assert (";scope=" in header) == (scope != "all")


def test_an_unsteered_response_reports_no_scope():
    assert steering_header("none", "generated") == "none"
