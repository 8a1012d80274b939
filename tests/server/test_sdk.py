"""The /v1 server through the official OpenAI SDK and LangChain, against a live Hypercorn."""

import base64
import struct

import openai
import pytest

MODEL = "SmolLM2-135M-Instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def test_chat_non_streaming(client):
    r = client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0, max_tokens=24)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == MODEL
    assert "Paris" in r.choices[0].message.content and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens > 0
    assert r.system_fingerprint == "millm:SmolLM2-135M-Instruct@unrecorded:float32/Q4_1:transformers"


def test_chat_streaming_matches_non_streaming(client):
    whole = client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0, max_tokens=24)
    chunks = list(client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0, max_tokens=24,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    last = chunks[-1]
    assert last.choices[0].finish_reason == "stop"
    assert last.usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.id == chunks[0].id and c.object == "chat.completion.chunk" for c in chunks)


def test_stream_length_finish(client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0, max_tokens=3,
                                                 stream=True))
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 3


def test_stop_sequence_over_http(client):
    r = client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0, max_tokens=24, stop=["Paris"])
    assert "Paris" not in r.choices[0].message.content and r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=FRANCE, temperature=0, max_tokens=24, stop="Paris", stream=True) if c.choices)
    assert streamed == r.choices[0].message.content


def test_n_and_extra_messages(client):
    colours = [{"role": "user", "content": "Please list three primary colours, briefly."}]
    alone = client.chat.completions.create(model=MODEL, messages=colours, temperature=0, max_tokens=12)
    r = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=FRANCE, temperature=0, max_tokens=12, n=2, seed=3,
        extra_body={"extra_messages": [colours]})
    assert r.headers["X-miLLM-Seed"] == '3;scope="batch-shape"'
    choices = r.parse().choices
    assert [c.index for c in choices] == [0, 1, 2, 3]  # conversation-major: messages x n, then each extra x n
    assert "Paris" in choices[0].message.content and choices[0].message.content == choices[1].message.content
    assert choices[2].message.content == choices[3].message.content == alone.choices[0].message.content


def test_completions_single_and_list(client):
    r = client.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=5)
    assert r.id.startswith("cmpl-") and r.object == "text_completion" and "Paris" in r.choices[0].text
    assert r.system_fingerprint.endswith(":transformers")
    many = client.completions.create(model=MODEL, prompt=["One, two,", "The capital of France is"],
                                     temperature=0, max_tokens=5)
    assert [c.index for c in many.choices] == [0, 1]
    assert many.choices[1].text == r.choices[0].text
    assert many.usage.prompt_tokens > r.usage.prompt_tokens
    streamed = list(client.completions.create(model=MODEL, prompt="The capital of France is", temperature=0,
                                              max_tokens=5, stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == r.choices[0].text


def test_completion_list_prompts_seeded_separately(client):
    kw = dict(model=MODEL, temperature=1.0, max_tokens=8, seed=9)
    pair = client.completions.create(prompt=["Once upon a time", "Once upon a time"], **kw)
    single = client.completions.create(prompt="Once upon a time", **kw)
    assert pair.choices[0].text == pair.choices[1].text == single.choices[0].text


def test_embeddings_float_and_base64(client, engine):
    floats = client.embeddings.create(model=MODEL, input=["hello world", "bye"], encoding_format="float")
    assert len(floats.data) == 2 and len(floats.data[0].embedding) == engine.model.config.hidden_size
    assert floats.usage.prompt_tokens > 0
    b64 = client.embeddings.create(model=MODEL, input="hello world")  # the SDK asks for base64 and decodes
    assert b64.data[0].embedding == pytest.approx(floats.data[0].embedding, rel=1e-5, abs=1e-4)
    raw = client.embeddings.with_raw_response.create(model=MODEL, input="hello world", encoding_format="base64")
    packed = raw.http_response.json()["data"][0]["embedding"]
    decoded = struct.unpack(f"<{len(floats.data[0].embedding)}f", base64.b64decode(packed))
    assert list(decoded) == b64.data[0].embedding


def test_embeddings_of_another_tokenizers_ids_say_what_to_pass(client):
    """The ids LangChain's OpenAIEmbeddings sends by default (tiktoken's) are a 400 naming the fix (issue 36)."""
    with pytest.raises(openai.BadRequestError) as exc:
        client.embeddings.create(model=MODEL, input=[[791, 6864, 315, 9822, 374, 12366, 13, 100257]])
    assert exc.value.code == "invalid_parameter" and exc.value.param == "input"
    assert "tiktoken" in exc.value.message and "check_embedding_ctx_length=False" in exc.value.message


def test_models(client):
    ids = [m.id for m in client.models.list()]
    assert MODEL in ids
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as exc:
        client.models.retrieve("no-such-model")
    assert exc.value.code == "model_not_found"


@pytest.mark.parametrize("kwargs,exc_type,code,param", [
    (dict(model="gpt-4o"), openai.NotFoundError, "model_not_found", "model"),
    (dict(max_tokens=100_000), openai.BadRequestError, "context_length_exceeded", "messages"),
    (dict(temperature=3), openai.BadRequestError, "invalid_parameter", "temperature"),
    (dict(seed=-1), openai.BadRequestError, "invalid_parameter", "seed"),
    (dict(top_p=2), openai.BadRequestError, "invalid_parameter", "top_p"),
    (dict(frequency_penalty=-3), openai.BadRequestError, "invalid_parameter", "frequency_penalty"),
    (dict(max_tokens=5, max_completion_tokens=6), openai.BadRequestError, "invalid_parameter", "max_completion_tokens"),
    (dict(n=2, stream=True), openai.BadRequestError, "invalid_parameter", "n"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]),
     openai.BadRequestError, "invalid_parameter", "tools[0].function.parameters"),
    (dict(logit_bias={"1": 5}), openai.BadRequestError, "field_not_honoured", "logit_bias"),
    (dict(extra_body={"steering": {"x": 1}}), openai.BadRequestError, "field_not_honoured", "steering"),
    (dict(extra_body={"profile": "no-such-profile"}), openai.NotFoundError, "profile_not_found", "profile"),
    (dict(response_format={"type": "json_object"}, stop=["}"]), openai.BadRequestError,
     "response_format_unsupported", "response_format"),
    (dict(logprobs=True, max_tokens=5), openai.BadRequestError, "invalid_parameter", "max_tokens"),
    (dict(top_logprobs=2, max_tokens=1), openai.BadRequestError, "invalid_parameter", "top_logprobs"),
])
def test_chat_errors_arrive_as_sdk_exceptions(client, kwargs, exc_type, code, param):
    args = dict(model=MODEL, messages=FRANCE, max_tokens=4) | kwargs
    with pytest.raises(exc_type) as exc:
        result = client.chat.completions.create(**args)
        if args.get("stream"):
            list(result)
    assert exc.value.code == code and exc.value.body["param"] == param


def test_embedding_errors(client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.embeddings.create(model=MODEL, input="hi", dimensions=8)
    assert exc.value.code == "field_not_honoured"
    with pytest.raises(openai.BadRequestError) as exc:
        client.embeddings.create(model=MODEL, input="word " * 9000, encoding_format="float")
    assert exc.value.code == "context_length_exceeded"


def test_completion_refusals(client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=MODEL, prompt="hi", n=2, max_tokens=2)
    assert exc.value.code == "field_not_honoured" and exc.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as exc:  # the behaviour change: no silent logprobs drop
        client.completions.create(model=MODEL, prompt="hi", logprobs=2, max_tokens=2)
    assert exc.value.code == "invalid_parameter" and exc.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body={"profile": "p"})
    assert exc.value.code == "field_not_honoured" and exc.value.body["param"] == "profile"


def test_no_change_values_accepted(client):
    r = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=FRANCE, max_tokens=3, n=1, logprobs=False, response_format={"type": "text"},
        tools=[], logit_bias={}, temperature=None)
    assert r.http_response.status_code == 200
    assert "X-miLLM-Ignored-Fields" not in r.http_response.headers


def test_langchain_chat_openai(server):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=server + "/v1", api_key="not-needed", model=MODEL, temperature=0, max_tokens=24,
                     max_retries=0)
    answer = llm.invoke("What is the capital of France?")
    assert "Paris" in answer.content
    streamed = "".join(chunk.content for chunk in llm.stream("What is the capital of France?"))
    assert streamed == answer.content
