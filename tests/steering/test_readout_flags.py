"""return_sae_activations' opt-in ``token_text`` and ``labels``: parsing, token texts, labels, rendering (no model)."""

from types import SimpleNamespace

import pytest

from millm.engine.decode.detok import token_texts
from millm.engine.events import Activations, Delta, Finish, Usage
from millm.errors import InvalidParameter, UnusedFieldsRefused
from millm.render.bodies import whole_body
from millm.render.shapes import CompletionShape
from millm.requests.builder import build_chat, build_completion
from millm.requests.fields import NESTED_KEYS
from millm.steering.readout import ReadoutRecorder, ReadoutSpec, bind_readout, check_readout, with_labels
from millm.store.db import SAE_COLUMNS, Store

STEERING = SimpleNamespace(attachments={"sae_a": SimpleNamespace(sae=SimpleNamespace(d_sae=16), layer=3)})


def parse(**ask):
    return bind_readout(check_readout(ask), STEERING, rows=1, prompt_tokens=5, max_tokens=4)  # type: ignore[arg-type]


def test_flags_default_off_and_parse_true():
    spec = parse()
    assert (spec.token_text, spec.labels) == (False, False)
    spec = parse(token_text=True, labels=True)
    assert (spec.token_text, spec.labels) == (True, True)
    assert parse(token_text=False).token_text is False


@pytest.mark.parametrize("key", ["token_text", "labels"])
@pytest.mark.parametrize("value", ["yes", 1, 0, None, [True], {"on": True}])
def test_non_boolean_flags_are_refused_naming_the_key(key, value):
    with pytest.raises(InvalidParameter) as caught:
        parse(**{key: value})
    assert caught.value.param == f"return_sae_activations.{key}"
    assert f"return_sae_activations.{key}" in caught.value.message and "true or false" in caught.value.message


def test_flags_are_read_keys_not_reported_as_ignored():
    assert {"token_text", "labels"} <= NESTED_KEYS["return_sae_activations"]
    ask = {"positions": "all", "token_text": True, "labels": True}
    chat = build_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], "return_sae_activations": ask},
                      lambda _: "transformers")
    assert chat.ignored == [] and chat.generations[0].readout == check_readout(ask)
    scoring = build_completion({"model": "m", "prompt": "hi", "max_tokens": 1, "logprobs": 0,
                                "return_sae_activations": {**ask, "bogus": 1}}, lambda _: "transformers")
    assert scoring.ignored == ["return_sae_activations.bogus"] and scoring.score.readout == check_readout(ask)
    with pytest.raises(UnusedFieldsRefused):  # strict mode refuses only what is unread
        build_completion({"model": "m", "prompt": "hi", "max_tokens": 1, "logprobs": 0,
                          "return_sae_activations": {**ask, "bogus": 1}}, lambda _: "transformers", True)
    build_completion({"model": "m", "prompt": "hi", "max_tokens": 1, "logprobs": 0,
                      "return_sae_activations": ask}, lambda _: "transformers", True)


class ByteTokenizer:
    """Each id is one byte (a multi-byte character spans tokens), plus special token 256."""

    def decode(self, ids, skip_special_tokens=False):
        text = bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
        return text if skip_special_tokens or 256 not in ids else "<s>" + text


def test_token_texts_join_to_the_text_and_never_split_a_character():
    ids = list("Caf\u00e9 ok".encode())
    texts = token_texts(ByteTokenizer(), ids)
    assert len(texts) == len(ids) and "".join(texts) == "Caf\u00e9 ok"
    assert texts[3:5] == ["", "\u00e9"]  # the token completing the character carries it
    assert token_texts(ByteTokenizer(), [256, 72]) == ["<s>", "H"]  # special tokens are kept
    assert token_texts(ByteTokenizer(), []) == []
    assert token_texts(ByteTokenizer(), list("\u00e9".encode())[:1]) == ["\ufffd"]  # an unfinished end is flushed


def recorder(**flags):
    import torch

    spec = ReadoutSpec("sae_a", 3, None, 2, "all", "post_steering", **flags)
    rec = ReadoutRecorder(spec, STEERING, lambda ids: token_texts(ByteTokenizer(), ids))  # type: ignore[arg-type]
    rec.values.append(torch.tensor([[2.0, 1.0], [3.0, 0.0], [0.5, 0.25]]))
    rec.indices.append(torch.tensor([[4, 9], [9, 1], [7, 4]]))
    return rec


def test_recorder_adds_token_text_only_when_asked():
    ids = list(b"Hi!x")
    plain = recorder().result(ids, 2)
    assert [set(p) for p in plain["positions"]] == [{"position", "token_id", "features"}] * 3
    body = recorder(token_text=True).result(ids, 2)
    assert [p["token"] for p in body["positions"]] == ["H", "i", "!"]  # x was never fed back: no activation
    assert list(body["positions"][0]) == ["position", "token_id", "token", "features"]
    assert [{k: v for k, v in p.items() if k != "token"} for p in body["positions"]] == plain["positions"]
    last = recorder(token_text=True, labels=True)
    last.spec = ReadoutSpec("sae_a", 3, None, 2, "last", "post_steering", token_text=True)
    assert [p["token"] for p in last.result(ids, 2)["positions"]] == ["!"]


def test_with_labels_and_the_registrys_label_map(tmp_path):
    body = recorder().result(list(b"Hi!"), 2)
    labelled = with_labels(body, {4: "four", 9: "nine"})
    assert [[(f["index"], f["label"]) for f in p["features"]] for p in labelled["positions"]] == [
        [(4, "four"), (9, "nine")], [(9, "nine")], [(7, None), (4, "four")]]
    assert "label" not in body["positions"][0]["features"][0]  # the engine's body is left as it was
    store = Store(tmp_path / "millm.db")
    record = {c: None for c in SAE_COLUMNS} | {"id": "sae_a", "name": "a", "path": "p", "format": "saelens",
                                               "architecture": "topk", "d_in": 8, "d_sae": 16}
    store.add_sae(record, {4: "sae_a", 12: "twelve"})
    assert store.label_map("sae_a") == {4: "sae_a", 12: "twelve"} and store.label_map("sae_b") == {}


def events(body):
    return [Delta(0, "ok"), Finish(0, "length", 1), Activations(body), Usage(3, 1)]


def test_rendered_labels_only_when_asked():
    body = recorder().result(list(b"Hi!"), 2)
    source = lambda sae_id: {4: "four"}  # noqa: E731
    ask = lambda **a: build_completion({"model": "m", "prompt": "hi", "max_tokens": 2,  # noqa: E731
                                        "return_sae_activations": a}, lambda _: "transformers")
    plain = whole_body(CompletionShape.of(ask(), "fp", source), events(body))["millm"]["sae_activations"]
    assert plain == body
    shown = whole_body(CompletionShape.of(ask(labels=True), "fp", source), events(body))["millm"]["sae_activations"]
    assert shown["positions"][0]["features"] == [{"index": 4, "value": 2.0, "label": "four"},
                                                {"index": 9, "value": 1.0, "label": None}]
    unwired = whole_body(CompletionShape.of(ask(labels=True), "fp"), events(body))["millm"]["sae_activations"]
    assert all(f["label"] is None for p in unwired["positions"] for f in p["features"])
