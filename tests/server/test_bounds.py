"""What one request may ask for is bounded by settings, refused past them with 400 naming the field
(issue 16, item 13); request preparation runs off the event loop (item 14)."""

from __future__ import annotations

import asyncio
import re
import threading
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest

from millm.config import Settings
from millm.engine.params import GenerationRequest, SamplingParams
from millm.engine.plan import Plan
from millm.errors import InvalidParameter
from millm.requests.builder import build_chat, build_completion, build_embedding
from millm.requests.limits import Limits, check_prompt_tokens, check_rows, prompt_tokens
from tests.support.fakes import FakeEngine

HI = [{"role": "user", "content": "hi"}]
SMALL = Limits(max_rows=4, max_prompts=3, max_embedding_inputs=2, max_prompt_tokens=10)


def transformers(_: str) -> str:
    return "transformers"


def refused(build: Any, body: dict[str, Any], limits: Limits = SMALL) -> InvalidParameter:
    with pytest.raises(InvalidParameter) as exc:
        build({"model": "m", **body}, transformers, False, limits)
    return exc.value


# pure rules
def test_rows_name_n_when_it_multiplies_past_the_bound():
    check_rows("prompt", 2, 2, SMALL)
    with pytest.raises(InvalidParameter, match="MILLM_MAX_ROWS") as exc:
        check_rows("prompt", 2, 3, SMALL)
    assert exc.value.param == "n"
    with pytest.raises(InvalidParameter) as exc:
        check_rows("extra_messages", 5, 1, SMALL)
    assert exc.value.param == "extra_messages"


def test_prompt_tokens_count_each_prompt_once_per_choice():
    plans = [Plan([[1, 2, 3], [4]], SamplingParams(n=2), 1)]
    assert prompt_tokens(plans) == 8
    check_prompt_tokens("prompt", 10, SMALL)
    with pytest.raises(InvalidParameter, match="MILLM_MAX_PROMPT_TOKENS"):
        check_prompt_tokens("prompt", 11, SMALL)


def test_limits_follow_the_settings(tmp_path):
    limits = Limits.of(Settings(home=tmp_path, max_rows=7, max_prompts=8, max_embedding_inputs=9,
                                max_prompt_tokens=10))
    assert limits == Limits(7, 8, 9, 10)


def test_every_bound_is_documented_with_its_default(tmp_path):
    readme = (Path(__file__).parents[2] / "docs" / "settings.md").read_text()  # the Settings page
    defaults = Limits.of(Settings(home=tmp_path))
    for f in fields(Limits):
        if type(getattr(defaults, f.name)) is not int:  # a policy (MILLM_TOOLS, MILLM_GGUF_STEERING), with the settings
            continue
        name = f"MILLM_{f.name.upper()}"
        found = re.search(rf"`{name}` \([^)]*?; ([\d,]+)\)", readme)
        assert found is not None, name
        assert int(found.group(1).replace(",", "")) == getattr(defaults, f.name)


# the builder calls them, before any model work
def test_chat_conversations_past_the_bound():
    error = refused(build_chat, {"messages": HI, "extra_messages": [HI] * 3})
    assert error.param == "extra_messages" and "4 conversations" in error.message


def test_chat_rows_past_the_bound():
    assert refused(build_chat, {"messages": HI, "extra_messages": [HI], "n": 3}).param == "n"
    build_chat({"model": "m", "messages": HI, "extra_messages": [HI], "n": 2}, transformers, False, SMALL)


def test_chat_scoring_conversations_past_the_bound():
    error = refused(build_chat, {"messages": HI, "extra_messages": [HI] * 3, "logprobs": True, "max_tokens": 1})
    assert error.param == "extra_messages"


def test_completion_prompts_rows_and_token_ids_past_the_bound():
    assert refused(build_completion, {"prompt": ["a"] * 4}).param == "prompt"
    assert refused(build_completion, {"prompt": ["a"] * 4, "logprobs": 1, "max_tokens": 1}).param == "prompt"
    rows = refused(build_completion, {"prompt": ["a", "b", "c"]}, replace(SMALL, max_rows=2))
    assert rows.param == "prompt" and "MILLM_MAX_ROWS" in rows.message  # n above 1 is refused on completions
    error = refused(build_completion, {"prompt": [[1] * 6, [2] * 5]})
    assert error.param == "prompt" and "11 prompt tokens" in error.message


def test_embedding_inputs_past_the_bound():
    assert refused(build_embedding, {"input": ["a", "b", "c"]}).param == "input"
    assert refused(build_embedding, {"input": [1] * 11}).param == "input"
    build_embedding({"model": "m", "input": ["a", "b"]}, transformers, False, SMALL)


# over HTTP, on a scripted engine: the app's settings set the bounds
def run(app: Any, scenario: Any) -> Any:
    async def main() -> Any:
        async with app.test_app():
            return await scenario(app.test_client())
    return asyncio.run(main())


def test_server_refuses_past_its_settings_before_any_decode_step(tmp_path):
    from millm.server.app import create_app

    engine = FakeEngine()
    app = create_app(Settings(home=tmp_path, max_rows=4, max_prompts=3, max_prompt_tokens=10), engine)

    async def scenario(client):
        rows = await client.post("/v1/chat/completions", json={"model": "fake", "messages": HI, "n": 5})
        tokens = await client.post("/v1/completions", json={"model": "fake", "prompt": "x" * 11, "max_tokens": 1})
        fits = await client.post("/v1/completions", json={"model": "fake", "prompt": "x" * 10, "max_tokens": 1})
        return [(r.status_code, (await r.get_json())) for r in (rows, tokens, fits)]

    (rows, rows_body), (tokens, tokens_body), (fits, _) = run(app, scenario)
    assert rows == 400 and rows_body["error"]["param"] == "n" and "MILLM_MAX_ROWS" in rows_body["error"]["message"]
    assert tokens == 400 and tokens_body["error"]["param"] == "prompt"
    assert fits == 200 and engine.steps > 0


class SlowPreparing(FakeEngine):
    """Holds ``prepare`` (tokenising and template rendering) until released, saying when it started."""

    def __init__(self) -> None:
        super().__init__()
        self.preparing = threading.Event()
        self.release = threading.Event()
        self.prepared = threading.Event()

    def prepare(self, request: GenerationRequest) -> Plan:
        self.preparing.set()
        self.release.wait(10)  # on the event loop (the defect) nothing can release it: it gives up, late
        try:
            return super().prepare(request)
        finally:
            self.prepared.set()


def test_health_answers_while_a_large_prompt_is_prepared(tmp_path):
    from millm.server.app import create_app

    engine = SlowPreparing()
    app = create_app(Settings(home=tmp_path), engine)
    order: list[str] = []

    async def scenario(client):
        big = asyncio.create_task(client.post("/v1/completions", json={
            "model": "fake", "prompt": "word " * 40_000, "max_tokens": 1}))  # 200,000 tokens on this engine
        await asyncio.to_thread(engine.preparing.wait, 60)
        for route in ("/api/health", "/api/health/inference"):
            answer = await client.get(route)
            order.append(f"{route} {answer.status_code} {'before' if not engine.prepared.is_set() else 'after'}")
        engine.release.set()
        done = await big
        order.append(f"completion {done.status_code}")

    run(app, scenario)
    # both health routes answered while the prompt was still being prepared; it is past the window
    assert order == ["/api/health 200 before", "/api/health/inference 200 before", "completion 400"]
