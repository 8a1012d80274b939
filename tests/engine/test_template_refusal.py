"""A chat template that refuses a conversation (Gemma-2's "System role not supported", raised with the
template's ``raise_exception``) is the client's input: 400 naming ``messages`` with the template's message,
never a 500 that SDKs retry. Other failures are not mistaken for one."""

from __future__ import annotations

import httpx
import pytest

from millm.engine.chat_tokens import chat_ids, hf_control_tokens, hf_plain, template_refusal
from millm.engine.params import ChatPrompt
from millm.engine.templates import render_chat
from millm.errors import InvalidParameter

GEMMA_LIKE = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
              "supported') }}{% endif %}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}"
              "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
SYSTEM_FIRST = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}]


def tiny_tokenizer(template: str):
    """A word-level HuggingFace tokenizer whose chat template is ``template``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1, "<s>": 2}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", bos_token="<s>")
    tokenizer.chat_template = template
    return tokenizer


def test_a_hf_template_refusal_is_a_400_naming_messages():
    tokenizer = tiny_tokenizer(GEMMA_LIKE)
    with pytest.raises(InvalidParameter) as info:
        chat_ids(lambda m, kw: render_chat(tokenizer, m, kw), SYSTEM_FIRST, {}, hf_control_tokens(tokenizer),
                 hf_plain(tokenizer))
    assert info.value.status == 400 and info.value.param == "messages"
    assert "System role not supported" in info.value.message
    ids = chat_ids(lambda m, kw: render_chat(tokenizer, m, kw), SYSTEM_FIRST[1:], {}, hf_control_tokens(tokenizer),
                   hf_plain(tokenizer))
    assert 1 in ids  # a conversation the template accepts renders as before


def test_a_llama_cpp_template_refusal_is_a_400_naming_messages():
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    formatter = Jinja2ChatFormatter(GEMMA_LIKE, eos_token="</s>", bos_token="<s>")
    tokenizer = tiny_tokenizer(GEMMA_LIKE)
    with pytest.raises(InvalidParameter, match="System role not supported") as info:
        chat_ids(lambda m, _: str(formatter(messages=m).prompt), SYSTEM_FIRST, {}, hf_control_tokens(tokenizer),
                 hf_plain(tokenizer))
    assert info.value.param == "messages"


def test_other_failures_are_not_taken_for_a_refusal():
    from jinja2 import Environment, StrictUndefined, TemplateSyntaxError, UndefinedError

    assert template_refusal(ValueError("a bug in miLLM")) is None  # not raised by a template's raise_exception
    assert template_refusal(KeyError("role")) is None
    try:
        Environment(undefined=StrictUndefined).from_string("{{ nothing.here }}").render()
    except UndefinedError as exc:
        assert template_refusal(exc) is None
    try:
        Environment().from_string("{% if %}")
    except TemplateSyntaxError as exc:
        assert template_refusal(exc) is None


def test_a_refusal_carries_the_users_own_text_back(monkeypatch):
    """A template that quotes the refused message sees placeholders for control-token text; the error
    gives the client's text back."""
    tokenizer = tiny_tokenizer("{{ raise_exception('refused: ' + messages[0]['content']) }}")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<ctl>"]})
    with pytest.raises(InvalidParameter) as info:
        chat_ids(lambda m, kw: render_chat(tokenizer, m, kw), [{"role": "user", "content": "a <ctl> b"}], {},
                 hf_control_tokens(tokenizer), hf_plain(tokenizer))
    assert info.value.message.endswith("refused: a <ctl> b")


def test_the_live_server_answers_400_for_a_refusing_template(server, engine, monkeypatch):
    monkeypatch.setattr(engine.tokenizer, "chat_template", GEMMA_LIKE)
    r = httpx.post(server + "/v1/chat/completions", timeout=60,
                   json={"model": engine.model_id, "messages": SYSTEM_FIRST, "max_tokens": 2})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages" and "System role not supported" in error["message"]
    assert error["type"] == "invalid_request_error"
    ok = httpx.post(server + "/v1/chat/completions", timeout=60,
                    json={"model": engine.model_id, "messages": SYSTEM_FIRST[1:], "max_tokens": 2})
    assert ok.status_code == 200, ok.text


def test_the_gguf_engine_refuses_alike(gguf_engine, monkeypatch):
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    monkeypatch.setattr(gguf_engine, "_formatter", Jinja2ChatFormatter(GEMMA_LIKE, eos_token="", bos_token=""))
    with pytest.raises(InvalidParameter, match="System role not supported") as info:
        gguf_engine.tokenize(ChatPrompt(SYSTEM_FIRST))
    assert info.value.param == "messages"
