"""GGUF models on llama.cpp: the same /v1 surface, the GGUF refusals, continuation, logging, CLI."""

import logging
import shutil

import httpx
import openai
import pytest
from typer.testing import CliRunner

from cli.main import app
from millm.errors import AmbiguousModelName
from millm.registry import bundled_gguf, resolve

GGUF = "SmolLM2-135M-Instruct:Q4_1"
FRANCE = "The capital of France is"


@pytest.fixture(scope="module")
def sdk(gguf_server):
    return openai.OpenAI(base_url=gguf_server + "/v1", api_key="x", max_retries=0, timeout=120)


def test_models_and_fingerprint(sdk, gguf_server):
    ids = [m.id for m in sdk.models.list()]
    assert GGUF in ids and "SmolLM2-135M-Instruct" in ids
    r = sdk.completions.create(model=GGUF, prompt=FRANCE, max_tokens=3, temperature=0)
    assert r.system_fingerprint == "millm:SmolLM2-135M-Instruct@unrecorded:unrecorded/Q4_1:llama.cpp"
    assert "Paris" in r.choices[0].text


def test_chat_streaming_equals_non_streaming(sdk):
    messages = [{"role": "user", "content": "Name three colours."}]
    sdk.chat.completions.create(model=GGUF, messages=messages, temperature=0, max_tokens=16)  # warm the prefix cache
    whole = sdk.chat.completions.create(model=GGUF, messages=messages, temperature=0, max_tokens=16)
    chunks = list(sdk.chat.completions.create(model=GGUF, messages=messages, temperature=0, max_tokens=16,
                                              stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and text
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert whole.choices[0].finish_reason in ("stop", "length")


def test_stop_and_max_completion_tokens(sdk):
    full = sdk.completions.create(model=GGUF, prompt=FRANCE, max_tokens=8, temperature=0).choices[0].text
    cut = sdk.completions.create(model=GGUF, prompt=FRANCE, max_tokens=8, temperature=0, stop=["aris"])
    assert cut.choices[0].text == full[:full.index("aris")] and cut.choices[0].finish_reason == "stop"
    r = sdk.chat.completions.create(model=GGUF, messages=[{"role": "user", "content": "Count to twenty."}],
                                    max_completion_tokens=4, temperature=0)
    assert r.usage.completion_tokens == 4 and r.choices[0].finish_reason == "length"


def test_sampling_and_penalties_are_applied(sdk):
    prompt = "List the word cat ten times:"
    base = sdk.completions.create(model=GGUF, prompt=prompt, max_tokens=20, temperature=0).choices[0].text
    penalised = sdk.completions.create(model=GGUF, prompt=prompt, max_tokens=20, temperature=0,
                                       frequency_penalty=2.0).choices[0].text
    assert penalised != base
    samples = {sdk.completions.create(model=GGUF, prompt="Once upon a time", max_tokens=8, temperature=1.5,
                                      top_p=1.0).choices[0].text for _ in range(3)}
    assert len(samples) > 1


def test_context_length_is_a_400(sdk, gguf_engine):
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.completions.create(model=GGUF, prompt="word " * (gguf_engine.context_window + 10), max_tokens=4)
    assert exc.value.code == "context_length_exceeded"
    assert str(gguf_engine.context_window) in exc.value.message
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.chat.completions.create(model=GGUF, messages=[{"role": "user", "content": "hi"}], max_tokens=100_000)
    assert exc.value.code == "context_length_exceeded"


def test_continuation_resumes(gguf_engine, sdk):
    convo = [{"role": "user", "content": "Write a sentence about the sea."},
             {"role": "assistant", "content": "The sea is"}]
    ids = gguf_engine.tokenize(__import__("millm.engine.params", fromlist=["ChatPrompt"]).ChatPrompt(convo))
    rendered = gguf_engine.decoder.decode(ids, skip_special_tokens=False)
    assert rendered.endswith("<|im_start|>assistant\nThe sea is")
    r = sdk.chat.completions.create(model=GGUF, messages=convo, temperature=0, max_tokens=10)
    assert not r.choices[0].message.content.lstrip().startswith("The sea")


def test_embeddings(sdk):
    r = sdk.embeddings.create(model=GGUF, input=["hello", "world"], encoding_format="float")
    assert len(r.data) == 2 and len(r.data[0].embedding) == 576 and r.data[0].embedding != r.data[1].embedding


@pytest.mark.parametrize("field,value", [
    ("logprobs", True), ("allowed_token_ids", [1, 2]), ("top_logprobs", 2),
    ("response_format", {"type": "json_object"}), ("profile", "p"), ("steering_intensity", 1.0),
    ("steering", {"a": 1}), ("n", 2), ("return_sae_activations", {}),
])
def test_gguf_refusals_before_any_load(server, field, value):
    body = {"model": GGUF, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, field: value}
    r = httpx.post(server + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "field_not_honoured", r.text
    assert r.json()["error"]["param"] == field
    assert httpx.get(server + "/api/health/inference", timeout=5).json()["engine"] == "transformers"


def test_gguf_completion_refusals(server):
    for field, value in (("logprobs", 2), ("allowed_token_ids", [1])):
        r = httpx.post(server + "/v1/completions", timeout=60,
                       json={"model": GGUF, "prompt": "x", "max_tokens": 1, field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field


def test_gguf_completions_honour_add_special_tokens(gguf_server, gguf_engine):
    """llama.cpp adds the BOS its file asks for unless add_special_tokens is false; true is the default."""
    from millm.engine.params import TextPrompt

    for value in (True, False):
        r = httpx.post(gguf_server + "/v1/completions", timeout=60, json={
            "model": GGUF, "prompt": "Hello world", "max_tokens": 1, "temperature": 0, "add_special_tokens": value})
        assert r.status_code == 200, r.text
        assert "X-miLLM-Ignored-Fields" not in r.headers
        assert r.json()["usage"]["prompt_tokens"] == len(gguf_engine.tokenize(TextPrompt("Hello world", value)))


def test_add_special_tokens_is_used_on_every_completions_column():
    from millm.requests.fields import USE, policy

    for engine, scoring in (("transformers", False), ("transformers", True), ("llama.cpp", False)):
        assert policy("add_special_tokens", "completions", engine, scoring) == USE


def test_chat_template_kwargs_reported_not_refused(gguf_server):
    r = httpx.post(gguf_server + "/v1/chat/completions", timeout=60, json={
        "model": GGUF, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "chat_template_kwargs": {"enable_thinking": False}})
    assert r.status_code == 200 and r.headers["X-miLLM-Ignored-Fields"] == '"chat_template_kwargs"'
    assert r.headers["X-miLLM-Steering"] == "none"


def test_steering_routes_refuse_gguf(gguf_server):
    r = httpx.get(gguf_server + "/api/steering", timeout=10)
    assert r.status_code == 400 and "llama.cpp" in r.json()["error"]["message"]


def test_quantization_ids_and_ambiguity(settings, server):
    settings.models_dir.mkdir(parents=True, exist_ok=True)
    first = settings.models_dir / "smolcopy.Q4_1.gguf"
    shutil.copy(bundled_gguf(), first)
    try:
        assert resolve("smolcopy", settings).id == "smolcopy:Q4_1"  # a bare name works while only one exists
        second = settings.models_dir / "smolcopy.Q8_0.gguf"
        shutil.copy(bundled_gguf(), second)
        with pytest.raises(AmbiguousModelName) as exc:
            resolve("smolcopy", settings)
        assert "Q4_1" in exc.value.message and "Q8_0" in exc.value.message
        r = httpx.post(server + "/v1/completions", json={"model": "smolcopy", "prompt": "x", "max_tokens": 1},
                       timeout=30)
        assert r.status_code == 400 and r.json()["error"]["code"] == "AMBIGUOUS_MODEL_NAME"
        ids = [m["id"] for m in httpx.get(server + "/v1/models", timeout=10).json()["data"]]
        assert "smolcopy:Q4_1" in ids and "smolcopy:Q8_0" in ids
        assert resolve("smolcopy:Q8_0", settings).quantization == "Q8_0"
    finally:
        for f in settings.models_dir.glob("smolcopy*"):
            f.unlink()


def test_llama_logs_go_to_the_logger_not_the_terminal(capfd, caplog, settings):
    from millm.engine.llama_engine import LlamaCppEngine

    caplog.set_level(logging.DEBUG, logger="millm.llama_cpp")
    engine = LlamaCppEngine.load(resolve(GGUF, settings), settings)
    engine.close()
    captured = capfd.readouterr()
    assert "llama" not in captured.err and "gguf" not in captured.err and "llama" not in captured.out
    assert any("llama" in r.getMessage() or "gguf" in r.getMessage() for r in caplog.records)


def test_cli_chat_on_gguf(gguf_engine):
    import cli.common

    cli.common._engines[GGUF] = gguf_engine
    result = CliRunner().invoke(app, ["chat", "--model", GGUF, "Name a colour.", "--temperature", "0",
                                      "--max-tokens", "8"])
    assert result.exit_code == 0 and result.stdout.strip()
    refused = CliRunner().invoke(app, ["chat", "--model", GGUF, "hi", "--steer", "1=2"])
    assert refused.exit_code == 1 and "llama.cpp" in refused.stderr
    scored = CliRunner().invoke(app, ["score", "in.jsonl", "-o", "out.jsonl", "--model", GGUF])
    assert scored.exit_code == 1


def test_gguf_embeddings_read_the_whole_input(gguf_engine):
    """An input past llama.cpp's default 512-token batch is embedded whole, as usage counts it."""
    words = " ".join(f"word{i}" for i in range(400))  # well over 512 tokens
    ids = gguf_engine.llm.tokenize(words.encode(), add_bos=False)
    head = gguf_engine.llm.detokenize(ids[:511]).decode()  # what a 512-token batch (with BOS) would keep
    (whole, cut), total = gguf_engine.embed([words, head])
    assert total > 600
    assert whole != pytest.approx(cut, abs=1e-3)
    (again,), _ = gguf_engine.embed([words])
    assert again == pytest.approx(whole, abs=1e-5)


@pytest.mark.parametrize("temperature", [1e-40, 5e-324])
def test_a_tiny_temperature_generates_as_greedy_on_llama_cpp(gguf_engine, temperature):
    from millm.engine.events import Delta
    from millm.engine.params import GenerationRequest, TextPrompt
    from millm.requests.validation import sampling_params

    def text(t: float) -> str:
        request = GenerationRequest([TextPrompt("The capital of France is")],
                                    sampling_params({"temperature": t, "max_tokens": 8}))
        return "".join(e.text for e in gguf_engine.generate(request) if isinstance(e, Delta))

    assert text(temperature) == text(0)
