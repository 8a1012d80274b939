"""steering_scope on both engines, greedy on the bundled model with a random SAE at layer 10.

The last prompt position yields the first generated token, so: under ``generated`` the first token is the
unsteered one and later tokens are steered; under ``prompt`` the first token is the fully steered one and later
tokens are not steered (the prompt's steered keys still shape them). Each engine is checked against itself."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from millm.engine.events import Delta
from millm.engine.params import ChatPrompt, GenerationRequest, SamplingParams
from millm.errors import FieldNotHonoured
from tests.support.saes import random_sae

if TYPE_CHECKING:
    from millm.engine.llama_engine import LlamaCppEngine
    from millm.steering.core import RequestSteering

SAE_ID, LAYER = "sae_scope_test", 10
CHAT = ChatPrompt([{"role": "user", "content": "Tell me about your day."}])


def steer() -> RequestSteering:
    from millm.steering.core import RequestSteering

    return RequestSteering("scoped", {SAE_ID: {3: 60.0}})


def text(eng, scope: str = "all", steered: bool = True, tokens: int = 12) -> str:
    request = GenerationRequest([CHAT], SamplingParams(temperature=0.0, max_tokens=tokens),
                                steering=steer() if steered else None, scope=scope)  # type: ignore[arg-type]
    return "".join(e.text for e in eng.generate(request) if isinstance(e, Delta))


def check_scopes(eng) -> None:
    plain, steered = text(eng, steered=False), text(eng)
    assert steered != plain  # the steering is strong enough to tell apart
    first_plain, first_steered = text(eng, steered=False, tokens=1), text(eng, tokens=1)
    assert first_plain != first_steered
    generated, prompt = text(eng, "generated"), text(eng, "prompt")
    assert text(eng, "generated", tokens=1) == first_plain and generated != plain
    assert text(eng, "prompt", tokens=1) == first_steered and prompt != steered
    assert text(eng, steered=False) == plain  # nothing is left behind


@pytest.fixture
def transformers_steered(engine) -> Iterator:
    engine.steering.attach(SAE_ID, random_sae(engine.steering.d_model, 32, seed=4), LAYER)
    try:
        yield engine
    finally:
        engine.steering.detach(SAE_ID)


@pytest.fixture(scope="module")
def gguf_steered(gguf_steerable) -> Iterator[LlamaCppEngine]:
    """``gguf_steerable`` (tests/conftest.py) with a random SAE attached at layer 10."""
    target = gguf_steerable.steering_target()
    assert target is not None
    target.steering.attach(SAE_ID, random_sae(576, 32, seed=4), LAYER)
    yield gguf_steerable


def test_transformers_steers_only_the_positions_the_scope_names(transformers_steered):
    check_scopes(transformers_steered)


def test_a_scoped_row_beside_others_is_gated_alone(transformers_steered):
    """Rows of one job with different scopes share each forward; each keeps its own gate."""
    alone = {scope: text(transformers_steered, scope) for scope in ("all", "generated", "prompt")}
    plans = [transformers_steered.prepare(GenerationRequest([CHAT], SamplingParams(temperature=0.0, max_tokens=12),
                                                            steering=steer(), scope=scope))  # type: ignore[arg-type]
             for scope in alone]
    texts: dict[int, str] = {}  # choice indices follow on, plan by plan: one choice each
    for event in transformers_steered.run_all(plans):
        if isinstance(event, Delta):
            texts[event.index] = texts.get(event.index, "") + event.text
    assert [texts[i] for i in range(3)] == list(alone.values())


def test_llama_cpp_sets_the_control_vector_for_prefill_or_decode_only(gguf_steered):
    check_scopes(gguf_steered)
    assert gguf_steered._uploaded is None  # cleared after every generation


def test_an_engine_that_cannot_steer_refuses_a_partial_scope(gguf_engine):
    request = GenerationRequest([CHAT], SamplingParams(max_tokens=1), scope="generated")
    with pytest.raises(FieldNotHonoured, match="steering_scope"):
        gguf_engine.prepare(request)
