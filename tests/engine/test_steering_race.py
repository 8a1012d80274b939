"""An operator change between a request's prepare and its run, on both engines (the bundled model, greedy).

A request is prepared (its steering decided) when it arrives and runs when its turn comes; an operator
change can land in between. ``steering_intensity: "off"`` must run unsteered whatever lands there, and a
request that follows the live values reports what it ran with (the label read when its rows are bound), not
what prepare saw.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import pytest

from millm.engine.events import Delta, Steered
from millm.render.headers import prepared_headers
from millm.requests.builder import build_chat
from millm.requests.limits import Limits
from millm.store import Store
from tests.support.saes import random_sae

if TYPE_CHECKING:
    pass

pytestmark = pytest.mark.model  # both engines, through getfixturevalue (which the conftest's marking cannot see)
LAYER, FEATURE, STRENGTH = 10, 3, 60.0
SAE_ID = "sae_race"
LIMITS = replace(Limits.of(), gguf_steering=True)  # GGUF chat honours steering_intensity (MILLM_GGUF_STEERING)


@pytest.fixture(params=["transformers", "llama.cpp"])
def steered_engine(request, tmp_path):
    """Each engine with a random SAE attached at layer 10 and no live values; a steering service over a
    store of this test's own."""
    from millm.steering.service import SteeringService

    engine = request.getfixturevalue("engine" if request.param == "transformers" else "gguf_steerable")
    target = engine.steering_target()
    target.steering.attach(SAE_ID, random_sae(576, 64, seed=1), LAYER)
    try:
        yield engine, SteeringService(Store(tmp_path / "race.db"))
    finally:
        target.steering.detach(SAE_ID)


def ask(engine, service, **fields):
    from millm.requests.generation import prepare

    body = {"model": engine.model_id, "messages": [{"role": "user", "content": "Tell me about your day."}],
            "max_tokens": 16, "temperature": 0, **fields}
    return prepare(engine, build_chat(body, lambda _: engine.engine_name, limits=LIMITS), LIMITS, service)


def run(engine, prepared) -> tuple[str, str | None]:
    """The answer's text and the label its Steered event carried (None: no such event)."""
    events = list(engine.run_all(prepared.plans))
    label = next((e.label for e in events if isinstance(e, Steered)), None)
    return "".join(e.text for e in events if isinstance(e, Delta)), label


def operator_steers(engine) -> None:
    engine.steering_target().steering.set_values(SAE_ID, {FEATURE: STRENGTH}, merge=False)


def test_off_runs_unsteered_whatever_the_operator_does_after_prepare(steered_engine):
    engine, service = steered_engine
    unsteered, label = run(engine, ask(engine, service))
    assert label == "none"
    for dial in ("off", 0):
        prepared = ask(engine, service, steering_intensity=dial)  # no live values: the dial changes nothing now
        operator_steers(engine)
        text, label = run(engine, prepared)
        assert (text, label, prepared_headers(prepared, prepared_built(engine, dial))["X-miLLM-Steering"]) == \
            (unsteered, "none", "none")
        engine.steering_target().steering.clear()
    engine.steering_target().steering.set_enabled(False)
    try:
        prepared = ask(engine, service, steering_intensity="off")  # disabled at prepare, enabled after
        operator_steers(engine)
        engine.steering_target().steering.set_enabled(True)
        assert run(engine, prepared) == (unsteered, "none")
    finally:
        engine.steering_target().steering.set_enabled(True)
        engine.steering_target().steering.clear()


def prepared_built(engine, dial):
    body = {"model": engine.model_id, "messages": [{"role": "user", "content": "x"}], "steering_intensity": dial}
    return build_chat(body, lambda _: engine.engine_name, limits=LIMITS)


def test_a_request_following_the_live_values_reports_what_it_ran_with(steered_engine):
    engine, service = steered_engine
    unsteered, _ = run(engine, ask(engine, service))
    prepared = ask(engine, service)  # no values yet: prepare sees "none"
    assert prepared.label == "none"
    operator_steers(engine)
    try:
        text, label = run(engine, prepared)
        assert label == "live" and text != unsteered
        assert text == run(engine, ask(engine, service))[0]  # what the live values steer
    finally:
        engine.steering_target().steering.clear()
