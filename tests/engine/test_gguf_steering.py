"""Steering GGUF models through llama.cpp's control vectors (MILLM_GGUF_STEERING, issue 27).

On the bundled Q4_1 file with small random SAEs: steering changes greedy output and clearing restores it byte
for byte; a request's own steering is released after the request, an error and a disconnect, and an operator
change made meanwhile stands; embeddings never see a control vector; a prefix cached under other steering is
never reused; and the layer a control vector steers is the transformers engine's resid_post of the same layer.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pytest

from millm.engine.base import StepControl
from millm.engine.events import Delta
from millm.engine.params import ChatPrompt, GenerationRequest, SamplingParams, TextPrompt
from millm.engine.scoring import ScoreRequest
from millm.errors import FieldNotHonoured, InvalidParameter
from millm.steering.readout import ReadoutAsk
from tests.support.saes import random_sae

if TYPE_CHECKING:
    from millm.engine.llama_engine import LlamaCppEngine
    from millm.steering.controller import RequestSteering
    from millm.steering.cvec import ControlVectorSteering

SAE_ID, LAYER, FEATURE, STRENGTH = "sae_gguf_test", 10, 3, 60.0
CHAT = ChatPrompt([{"role": "user", "content": "Tell me about your day."}])
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


@pytest.fixture(scope="module")
def steered(gguf_steerable) -> Iterator[LlamaCppEngine]:
    """``gguf_steerable`` (tests/conftest.py) with a random SAE attached at layer 10."""
    target = gguf_steerable.steering_target()
    assert target is not None
    target.steering.attach(SAE_ID, random_sae(576, 64, seed=1), LAYER)
    yield gguf_steerable


@pytest.fixture
def steering(steered) -> Iterator[ControlVectorSteering]:
    from millm.steering.cvec import ControlVectorSteering

    target = steered.steering_target()
    assert target is not None and isinstance(target.steering, ControlVectorSteering)
    yield target.steering
    target.steering.clear()
    target.steering.set_enabled(True)


def text(eng: LlamaCppEngine, prompt=CHAT, steering: RequestSteering | None = None, control: StepControl | None = None,
         params: SamplingParams = GREEDY) -> str:
    plan = eng.prepare(GenerationRequest([prompt], params, steering=steering))
    return "".join(e.text for e in eng.run(plan, control) if isinstance(e, Delta))


def unsteered_cold(eng: LlamaCppEngine) -> str:
    eng.llm.reset()
    return text(eng)


def test_steering_changes_greedy_output_and_clearing_restores_it(steered, steering):
    before = unsteered_cold(steered)
    steering.set_values(SAE_ID, {FEATURE: STRENGTH}, merge=False)
    during = text(steered)
    assert during != before
    assert steering.label() == "live"
    steering.set_enabled(False)
    assert text(steered) == before  # disabled: nothing steers
    steering.set_enabled(True)
    assert text(steered) == during
    steering.clear()
    assert text(steered) == before  # byte for byte
    assert steered._uploaded is None  # cleared after every generation


def test_a_request_profile_steers_it_alone_and_is_released_after_it(steered, steering):
    from millm.steering.controller import RequestSteering

    before = unsteered_cold(steered)
    profile = RequestSteering("p", {SAE_ID: {FEATURE: STRENGTH}})
    lives: list[bool] = []
    control = StepControl(run_commands=lambda: lives.append(steering.live))
    alone = text(steered, steering=profile, control=control)
    assert alone != before and lives and not any(lives)  # not live while the request runs
    assert steering.live and steering.vector() is None
    assert text(steered) == before


def test_released_after_an_error_and_after_a_disconnect(steered, steering):
    from millm.steering.controller import RequestSteering

    before = unsteered_cold(steered)
    profile = RequestSteering("p", {SAE_ID: {FEATURE: STRENGTH}})

    def boom() -> None:
        raise RuntimeError("between steps")

    with pytest.raises(RuntimeError):
        text(steered, steering=profile, control=StepControl(run_commands=boom))
    assert steering.live and steered._uploaded is None
    assert text(steered) == before

    control = StepControl()
    events = steered.run(steered.prepare(GenerationRequest([CHAT], GREEDY, steering=profile)), control)
    assert isinstance(next(e for e in events if isinstance(e, Delta)), Delta)
    assert not steering.live
    events.close()  # the consumer went away
    assert steering.live and steered._uploaded is None
    assert text(steered) == before

    control = StepControl()
    control.cancel.set()  # a client gone after its first token
    text(steered, steering=profile, control=control)
    assert steering.live and steered._uploaded is None
    assert text(steered) == before


def test_operator_change_during_a_profile_request_wins(steered, steering):
    from millm.steering.controller import RequestSteering

    profile = RequestSteering("p", {SAE_ID: {FEATURE: STRENGTH}})
    steered.llm.reset()
    alone = text(steered, steering=profile)
    changed: list[bool] = []

    def operator() -> None:
        if not changed:
            steering.set_values(SAE_ID, {7: -STRENGTH}, merge=False)
            changed.append(steering.live)

    steered.llm.reset()  # both cold: a warm cache evaluates the prompt's last token alone
    during = text(steered, steering=profile, control=StepControl(run_commands=operator))
    assert during == alone  # the request keeps its own steering
    assert changed == [False]  # the operator's value was not live while it ran
    assert steering.live and steering.snapshot()["saes"][SAE_ID]["values"] == {"7": -STRENGTH}  # not undone
    steering.clear()


def test_operator_change_reaches_a_live_request_at_the_next_token(steered, steering):
    before = unsteered_cold(steered)
    steps: list[int] = []

    def operator() -> None:
        steps.append(1)
        if len(steps) == 4:
            steering.set_values(SAE_ID, {FEATURE: STRENGTH}, merge=False)

    steered.llm.reset()
    during = text(steered, control=StepControl(run_commands=operator))
    assert during != before and during[:5] == before[:5]
    steering.clear()
    assert text(steered) == before  # the mixed cache is not reused


def test_embeddings_are_never_steered(steered, steering):
    from millm.steering.controller import RequestSteering

    inputs = ["The weather today is sunny.", "hello"]
    before, _ = steered.embed(inputs)
    steering.set_values(SAE_ID, {FEATURE: 200.0}, merge=False)
    during, _ = steered.embed(inputs)
    text(steered, steering=RequestSteering("p", {SAE_ID: {FEATURE: 200.0}}), params=SamplingParams(0.0, max_tokens=2))
    after, _ = steered.embed(inputs)
    assert before == during == after


def test_a_prefix_cached_under_other_steering_is_never_reused(steered, steering, monkeypatch):
    resets: list[int] = []
    real_reset = steered.llm.reset
    monkeypatch.setattr(steered.llm, "reset", lambda: (resets.append(1), real_reset())[1])
    text(steered)  # warms the cache, unsteered
    resets.clear()
    text(steered)
    assert not resets  # unchanged steering keeps llama.cpp's prefix reuse
    steering.set_values(SAE_ID, {FEATURE: STRENGTH}, merge=False)
    warm = text(steered)  # steered, after an unsteered request with the same prefix
    assert resets
    real_reset()  # a cold cache
    assert text(steered) == warm
    resets.clear()
    assert text(steered) == warm and not resets  # the same steering reuses its own cache


def test_attach_checks_the_files_width_and_layers(steered, steering):
    with pytest.raises(InvalidParameter, match="d_in"):
        steering.attach("wide", random_sae(512, 16), 5)
    with pytest.raises(InvalidParameter, match="layer 1"):
        steering.attach("first", random_sae(576, 16), 0)
    with pytest.raises(InvalidParameter, match="between 1 and 29"):
        steering.attach("past", random_sae(576, 16), steered.n_layers)
    with pytest.raises(InvalidParameter, match="norm"):
        steering.attach("normed", random_sae(576, 16, normalisation="layer_norm"), 5)
    assert set(steering.attachments) == {SAE_ID}


def test_readouts_and_monitoring_stay_refused(steered, steering):
    with pytest.raises(FieldNotHonoured):
        steered.prepare(GenerationRequest([CHAT], GREEDY, readout=ReadoutAsk(SAE_ID)))
    caps = steered.capabilities
    assert caps.steers and not caps.reads and not caps.scores and not steered.steering_target().reads
    assert not hasattr(steering, "reading_unsteered")  # control vectors have nothing to read with
    with pytest.raises(FieldNotHonoured):
        steered.score(ScoreRequest([]))
    with pytest.raises(FieldNotHonoured):
        steered.forced([])


def test_off_by_default_nothing_steers(gguf_engine):
    from millm.steering.controller import RequestSteering

    assert gguf_engine.steering_target() is None
    with pytest.raises(FieldNotHonoured) as exc:
        gguf_engine.prepare(GenerationRequest([CHAT], GREEDY, steering=RequestSteering("p", {})))
    assert exc.value.param == "profile"


# the layer a control vector steers, pinned against the transformers engine
def _cvec_logits(llm, steering: ControlVectorSteering | None, ids: list[int]) -> np.ndarray:
    import llama_cpp

    llm.reset()
    vector = steering.vector() if steering is not None else None
    if vector is None:
        llama_cpp.llama_set_adapter_cvec(llm.ctx, None, 0, llm.n_embd(), -1, -1)
    else:
        data = vector.data.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        assert llama_cpp.llama_set_adapter_cvec(llm.ctx, data, vector.data.size, llm.n_embd(), vector.il_start,
                                                vector.il_end) == 0
    try:
        llm.eval(ids)
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).copy()
    finally:
        llama_cpp.llama_set_adapter_cvec(llm.ctx, None, 0, llm.n_embd(), -1, -1)
        llm.reset()


def _hf_logits(engine, ids: list[int], values: dict[int, float] | None = None) -> np.ndarray:
    """The transformers engine's last logits for ``ids``, as a scheduler row steered by ``values`` on "pin"."""
    import torch

    from millm.steering.controller import RequestSteering

    with torch.no_grad(), engine.steering.each_row([RequestSteering("pin", {"pin": values or {}})]):
        return engine.model(torch.tensor([ids], device=engine.model.device)).logits[0, -1].float().cpu().numpy()


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("layer", [1, 10, 20, 29])
def test_a_control_vector_at_layer_l_is_resid_post_of_hf_layer_l(gguf_engine, engine, layer):
    """The same SAE delta at layer L on llama.cpp moves the logits as the transformers engine's hook on decoder
    layer L does (cosine of the two logit changes), and clearly more like L than like L-1 or L+1: llama.cpp's
    control vector for layer il is added to decoder layer il's output, its buffer starting at layer 1."""
    from llama_cpp import Llama

    from millm.steering.cvec import ROW, ControlVectorSteering

    sae = random_sae(576, 8, seed=2)
    llm = Llama(str(gguf_engine.entry.path), n_ctx=128, n_threads=None, verbose=False)
    try:
        ids = llm.tokenize(b"The capital of France is", add_bos=True)
        cvec = ControlVectorSteering(gguf_engine.n_layers, 576)
        cvec.attach("pin", sae, layer)
        cvec.set_values("pin", {0: 30.0}, merge=False)
        cvec.bind_row(ROW, None)
        gguf_effect = _cvec_logits(llm, cvec, ids) - _cvec_logits(llm, None, ids)
    finally:
        llm.close()
    base = _hf_logits(engine, ids)
    cosines = {}
    for hf_layer in (layer - 1, layer, layer + 1):
        if not 0 <= hf_layer < len(engine.steering.layers):
            continue
        engine.steering.attach("pin", sae, hf_layer)
        try:
            cosines[hf_layer] = _cos(gguf_effect, _hf_logits(engine, ids, {0: 30.0}) - base)
        finally:
            engine.steering.detach("pin")
    assert cosines[layer] > 0.95, cosines
    # the neighbours' effects are alike too (one random direction), but at least 3 times further away
    assert all(3 * (1 - cosines[layer]) < 1 - c for other, c in cosines.items() if other != layer), cosines


def test_text_prompts_are_steered_too(steered, steering):
    prompt = TextPrompt("The capital of France is")
    before = text(steered, prompt)
    steering.set_values(SAE_ID, {FEATURE: STRENGTH}, merge=False)
    assert text(steered, prompt) != before
