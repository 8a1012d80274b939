"""Research runs on the request path (the bundled model): a sweep's answer is, byte for byte, what
``/v1/chat/completions`` answers to the same message, seed, sampling fields and steering; and its fluency is
the scoring path's."""

from __future__ import annotations

import httpx

from millm.store import Store

SAE, MUSIC, STRENGTH, SEED, TOKENS = "smollm2-135m-res-L10", 2375, 40.0, 7, 16


def test_a_sweeps_answer_is_the_chat_completion_of_the_same_request(server, engine, settings):
    from millm.research.answers import SAMPLING
    from millm.research.measure import NEUTRAL_PROMPTS
    from millm.research.sweep import sweep_feature
    from millm.steering.service import SteeringService

    base = server
    assert httpx.post(base + f"/api/saes/{SAE}/attach", json={}, timeout=60).status_code == 200
    try:
        profile = {"name": "sweep-equal", "entries": [{"sae": SAE, "feature": MUSIC, "strength": STRENGTH}]}
        assert httpx.post(base + "/api/profiles", json=profile, timeout=30).status_code == 201
        service = SteeringService(Store(settings.home / "millm.db"))
        result = sweep_feature(service, engine, SAE, MUSIC, words=("music",), strengths=[STRENGTH], prompts=1,
                               seed=SEED, tokens=TOKENS)
        body = {"model": engine.model_id, "messages": [{"role": "user", "content": NEUTRAL_PROMPTS[0]}],
                "seed": SEED, "max_tokens": TOKENS, "temperature": SAMPLING.temperature, "top_p": SAMPLING.top_p,
                "repetition_penalty": SAMPLING.repetition_penalty, "profile": "sweep-equal"}
        reply = httpx.post(base + "/v1/chat/completions", json=body, timeout=300)
        plain = httpx.post(base + "/v1/chat/completions", json={**body, "profile": None, "steering_intensity": "off"},
                           timeout=300)
    finally:
        httpx.delete(base + "/api/profiles/sweep-equal", timeout=30)
        httpx.post(base + f"/api/saes/{SAE}/detach", timeout=60)
    assert reply.status_code == 200 and "X-miLLM-Ignored-Fields" not in reply.headers
    steered = reply.json()["choices"][0]["message"]["content"]
    assert result.point(STRENGTH).example == steered
    assert steered != plain.json()["choices"][0]["message"]["content"]  # the steering is in it


def test_fluency_is_the_scoring_paths_echo(engine):
    from millm.research.measure import NEUTRAL_PROMPTS, Measure, mean

    measure = Measure(engine, NEUTRAL_PROMPTS[:2], SEED, 8)
    [(total, count)] = measure.logprobs([measure.plain[0]])
    assert count > 0 and total < 0
    assert measure.plain_logprob == mean(measure.logprobs(measure.plain, prompted=False))  # fluency: no prompt
    scored = measure.plain_scored
    assert scored.prompted == mean(measure.logprobs(measure.plain)) != scored.unprompted
