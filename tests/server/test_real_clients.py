"""What real clients send (lm-eval, LlamaIndex, instructor): token-id prompts, echoed prompt log-probabilities,
seeds on GGUF, Pydantic's schema keywords, tool_choice "none", unknown routes."""

from __future__ import annotations

import json

import httpx
import pytest

MODEL = "SmolLM2-135M-Instruct"
TEXT = "The capital of France is Paris"


def post(base: str, route: str, **body):
    return httpx.post(f"{base}/v1/{route}", json={"model": MODEL} | body, timeout=120)


def ids_of(engine, text: str) -> list[int]:
    return engine.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_token_id_prompts_equal_their_text_prompts(server, engine):
    ids = ids_of(engine, TEXT)
    by_ids = post(server, "completions", prompt=[ids, ids_of(engine, "Once upon")], max_tokens=4, temperature=0)
    by_text = post(server, "completions", prompt=[TEXT, "Once upon"], max_tokens=4, temperature=0,
                   add_special_tokens=False)
    assert by_ids.status_code == 200 and [c["text"] for c in by_ids.json()["choices"]] == [
        c["text"] for c in by_text.json()["choices"]]
    single = post(server, "completions", prompt=ids, max_tokens=4, temperature=0)
    assert single.json()["choices"][0]["text"] == by_ids.json()["choices"][0]["text"]
    bad = post(server, "completions", prompt=[ids, [1, 10**9]], max_tokens=2)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt[1]"


def test_echo_logprobs_equal_a_direct_forward_pass(server, engine):
    """lm-eval's loglikelihood request: the continuation's log-probability is the sum over its tokens."""
    import torch

    context, continuation = ids_of(engine, "The capital of France is"), ids_of(engine, " Paris")
    r = post(server, "completions", prompt=[context + continuation], max_tokens=1, logprobs=1, echo=True,
             temperature=0, seed=1234)
    assert r.status_code == 200 and r.headers["X-miLLM-Steering"] == "none"
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert len(lp["tokens"]) == len(context) + len(continuation) + 1  # the prompt, then the next token
    with torch.inference_mode():
        direct = engine.model(torch.tensor([context + continuation])).logits[0].double().log_softmax(-1)
    want = sum(float(direct[len(context) - 1 + i, t]) for i, t in enumerate(continuation))
    got = sum(lp["token_logprobs"][len(context):-1])
    assert got == pytest.approx(want, abs=1e-4)
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    only_prompt = post(server, "completions", prompt=TEXT, max_tokens=0, logprobs=2, echo=True)
    body = only_prompt.json()
    assert body["choices"][0]["text"] == TEXT and body["usage"]["completion_tokens"] == 0
    assert len(body["choices"][0]["logprobs"]["tokens"]) == body["usage"]["prompt_tokens"]


def test_echo_is_scoring_and_refuses_what_scoring_refuses(server):
    no_logprobs = post(server, "completions", prompt=TEXT, max_tokens=1, echo=True)
    assert no_logprobs.status_code == 400 and no_logprobs.json()["error"]["param"] == "echo"
    steered = post(server, "completions", prompt=TEXT, max_tokens=1, logprobs=1, echo=True, profile="x")
    assert steered.status_code == 400 and steered.json()["error"]["code"] == "field_not_honoured"
    long = post(server, "completions", prompt=TEXT, max_tokens=5, logprobs=1, echo=True)
    assert long.status_code == 400 and long.json()["error"]["param"] == "max_tokens"


def test_seeded_gguf_requests_repeat_across_cache_states(gguf_server):
    def ask(**extra):
        body = {"model": "SmolLM2-135M-Instruct:Q4_1", "messages": [{"role": "user", "content": "Tell me about cats."}],
                "max_tokens": 20, "temperature": 1.0} | extra
        return httpx.post(gguf_server + "/v1/chat/completions", json=body, timeout=120)

    first = ask(seed=7)
    ask(max_tokens=3, temperature=0)  # warms llama.cpp's prompt cache with the same prefix
    second = ask(seed=7)
    assert first.status_code == 200 and first.headers["X-miLLM-Seed"] == '7;scope="request"'
    assert first.json()["choices"][0]["message"]["content"] == second.json()["choices"][0]["message"]["content"]
    assert ask(seed=8).json()["choices"][0]["message"]["content"] != first.json()["choices"][0]["message"]["content"]


def test_tool_choice_none_changes_nothing_and_legacy_functions_point_to_tools(server):
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
    assert post(server, "chat/completions", **chat, tool_choice="none").status_code == 200
    honoured = post(server, "chat/completions", **chat, tools=[{"type": "function", "function": {"name": "f"}}],
                    tool_choice="auto")
    assert honoured.status_code == 200 and honoured.headers["X-miLLM-Constrained"] == 'tools;choice="auto"'
    refused = post(server, "chat/completions", **chat, functions=[{"name": "f"}], function_call="auto")
    message = refused.json()["error"]["message"]
    assert refused.status_code == 400 and "'functions'" in message and "'function_call'" in message
    assert "'tools' and 'tool_choice'" in message


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/audio/speech"])
def test_unknown_routes_are_openai_shaped_404s_naming_the_served_routes(server, path):
    r = httpx.post(server + path, json={}, timeout=10)
    error = r.json()["error"]
    assert r.status_code == 404 and "/v1/chat/completions" in error["message"] and "/v1/embeddings" in error["message"]


@pytest.mark.parametrize("schema,valid,invalid", [
    ({"type": "integer", "exclusiveMinimum": 5}, "6", "5"),
    ({"type": "number", "exclusiveMaximum": 1}, "0.5", "1"),
    ({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False}, '[1, "a"]',
     '["a", 1]'),
])
def test_pydantic_keywords_are_enforced_token_by_token(engine, schema, valid, invalid):
    """The matcher miLLM decodes with refuses, token by token, a document the keyword forbids."""
    from millm.structured.schema import check_response_format

    wrapped = {"type": "object", "properties": {"x": schema}, "required": ["x"], "additionalProperties": False}
    constraint = check_response_format({"type": "json_schema", "json_schema": {"name": "k", "schema": wrapped}})
    assert constraint is not None

    def accepted(value: str) -> bool:
        matcher = engine.constraints.matcher(constraint)
        return all(matcher.consume_token(t) for t in ids_of(engine, json.dumps({"x": 0})[:-3] + value + "}")) \
            and matcher.is_accepting()

    assert accepted(valid) and not accepted(invalid)
