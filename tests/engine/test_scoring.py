"""Scoring mode: pure functions on hand-built logits, then the real model through the server."""

import math

import httpx
import pytest

from millm.engine.params import ChatPrompt
from millm.engine.scoring import ScoringParams, check_allowed, check_in_vocab, score_row
from millm.errors import InvalidParameter, InvalidScoringRequest, NonFiniteLogits
from millm.requests.validation import check_scoring_temperature

MODEL = "SmolLM2-135M-Instruct"


def params(allowed=None, temperature=1.0, top_n=5, report=True):
    return ScoringParams(None if allowed is None else tuple(allowed), temperature, top_n, report)


def test_allowed_set_is_normalised_and_fully_returned():
    import torch

    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, 3.0])
    result = score_row(logits, params([1, 3, 2], top_n=3))
    assert [s.token_id for s in result.top] == [1, 2, 3] and result.chosen.token_id == 1
    probs = torch.tensor([math.exp(s.logprob) for s in result.top])
    assert probs.sum().item() == pytest.approx(1.0)
    want = torch.softmax(logits[[1, 2, 3]].double(), -1)
    assert probs.tolist() == pytest.approx(want.tolist())


def test_temperature_divides_and_zero_means_unscaled():
    import torch

    logits = torch.tensor([2.0, 0.0])
    hot = score_row(logits, params(temperature=2.0, top_n=2))
    assert math.exp(hot.chosen.logprob) == pytest.approx(torch.softmax(logits / 2, -1)[0].item())
    assert score_row(logits, params(temperature=0.0)).chosen.logprob == pytest.approx(
        score_row(logits, params(temperature=1.0)).chosen.logprob)
    with pytest.raises(InvalidParameter, match="overflow"):
        check_scoring_temperature(0.0005)
    assert check_scoring_temperature(0.001) == 0.001 and check_scoring_temperature(None) == 1.0


def test_non_finite_logits():
    import torch

    nan = torch.tensor([1.0, float("nan"), 0.0])
    with pytest.raises(NonFiniteLogits):
        score_row(nan, params())  # unrestricted: NaN anywhere reaches the answer
    with pytest.raises(NonFiniteLogits):
        score_row(nan, params([0, 1]))
    assert score_row(nan, params([0, 2])).chosen.token_id == 0  # outside the allowed set: fine
    masked = torch.tensor([1.0, -float("inf"), 0.0])
    assert score_row(masked, params([0, 2])).chosen.token_id == 0
    with pytest.raises(NonFiniteLogits):
        score_row(masked, params([0, 1], top_n=2))  # a reported token at -inf
    with pytest.raises(NonFiniteLogits):
        score_row(torch.tensor([float("inf"), 0.0]), params())


def test_allowed_ids_checked():
    assert check_allowed([3, 1, 3]) == (3, 1)
    with pytest.raises(InvalidScoringRequest, match="vocabulary"):
        check_in_vocab(ScoringParams((1, 10), 1.0, 0, True), 10)
    with pytest.raises(InvalidParameter):
        check_allowed([])


def post(server, route, **body):
    return httpx.post(f"{server}/v1/{route}", json={"model": MODEL, "max_tokens": 1} | body, timeout=120)


PROMPT = "Question: is the sky blue? Answer yes or no.\nAnswer:"


def raw_logits(engine, ids):
    import torch

    with torch.inference_mode():
        return engine.model(torch.tensor([ids])).logits[0, -1].double()


def test_completion_scoring_matches_softmax_of_raw_logits(server, engine):
    import torch

    yes, no = (engine.tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in (" yes", " no"))
    r = post(server, "completions", prompt=PROMPT, logprobs=2, allowed_token_ids=[yes, no])
    assert r.status_code == 200, r.text
    assert r.headers["X-miLLM-Steering"] == "none"
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    top = lp["top_logprobs"][0]
    assert set(top) == {" yes", " no"}
    assert sum(math.exp(v) for v in top.values()) == pytest.approx(1.0)
    logits = raw_logits(engine, engine.tokenizer(PROMPT)["input_ids"])
    want = torch.softmax(logits[[yes, no]], -1)
    assert math.exp(top[" yes"]) == pytest.approx(want[0].item(), rel=1e-4)
    assert choice["text"] == max(top, key=top.get) and lp["tokens"] == [choice["text"]]
    assert lp["text_offset"] == [len(PROMPT)] and choice["finish_reason"] == "length"
    assert r.json()["usage"]["completion_tokens"] == 1


def test_unrestricted_top_logprobs_and_token_id_keys(server, engine):
    import torch

    r = post(server, "completions", prompt=PROMPT, logprobs=5, return_tokens_as_token_ids=True).json()
    top = r["choices"][0]["logprobs"]["top_logprobs"][0]
    assert len(top) == 5 and all(k.startswith("token_id:") for k in top)
    logits = raw_logits(engine, engine.tokenizer(PROMPT)["input_ids"])
    best = int(logits.argmax())
    assert r["choices"][0]["logprobs"]["tokens"] == [f"token_id:{best}"]
    assert top[f"token_id:{best}"] == pytest.approx(torch.log_softmax(logits, -1)[best].item(), abs=1e-4)
    zero = post(server, "completions", prompt=PROMPT, logprobs=0).json()["choices"][0]["logprobs"]
    assert zero["top_logprobs"] == [{}] and len(zero["token_logprobs"]) == 1


def test_tokens_with_the_same_text_share_an_entry(server, engine):
    same = [i for i in range(len(engine.tokenizer)) if engine.tokenizer.decode([i]) == "\ufffd"][:2]
    other = engine.tokenizer(" yes", add_special_tokens=False)["input_ids"][0]
    r = post(server, "completions", prompt=PROMPT, logprobs=3, allowed_token_ids=[*same, other]).json()
    assert len(r["choices"][0]["logprobs"]["top_logprobs"][0]) == 2
    by_id = post(server, "completions", prompt=PROMPT, logprobs=3, allowed_token_ids=[*same, other],
                 return_tokens_as_token_ids=True).json()
    assert len(by_id["choices"][0]["logprobs"]["top_logprobs"][0]) == 3


def test_allowed_without_logprobs_constrains_only(server, engine):
    ids = [engine.tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in (" cat", " dog")]
    choice = post(server, "completions", prompt=PROMPT, allowed_token_ids=ids).json()["choices"][0]
    assert choice["logprobs"] is None and choice["text"] in (" cat", " dog")


def test_prompt_list_batched_equals_one_at_a_time(server):
    prompts = ["The capital of France is", "1, 2, 3,", PROMPT, "Hello", "A much longer prompt that pads the others"]
    batch = post(server, "completions", prompt=prompts, logprobs=3).json()["choices"]
    assert [c["index"] for c in batch] == list(range(5))
    for prompt, choice in zip(prompts, batch):
        alone = post(server, "completions", prompt=prompt, logprobs=3).json()["choices"][0]
        assert alone["text"] == choice["text"]
        for key, value in alone["logprobs"]["top_logprobs"][0].items():
            assert choice["logprobs"]["top_logprobs"][0][key] == pytest.approx(value, abs=1e-4)


def test_chat_scoring_equals_completion_scoring_of_rendered_prompt(server, engine):
    messages = [{"role": "user", "content": "Is the sky blue? Answer true or false."}]
    ids = [engine.tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in ("true", "false")]
    chat = post(server, "chat/completions", messages=messages, logprobs=True, top_logprobs=2,
                allowed_token_ids=ids, return_tokens_as_token_ids=True)
    assert chat.status_code == 200, chat.text
    content = chat.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 1 and len(content[0]["top_logprobs"]) == 2
    assert content[0]["token"].startswith("token_id:")
    assert bytes(content[0]["bytes"]).decode() == engine.tokenizer.decode([int(content[0]["token"][9:])])
    rendered = engine.tokenizer.decode(engine.tokenize(ChatPrompt(messages)))
    comp = post(server, "completions", prompt=rendered, add_special_tokens=False, logprobs=2, allowed_token_ids=ids,
                return_tokens_as_token_ids=True).json()["choices"][0]["logprobs"]["top_logprobs"][0]
    for entry in content[0]["top_logprobs"]:
        assert entry["logprob"] == pytest.approx(comp[entry["token"]], abs=1e-6)
    zero = post(server, "chat/completions", messages=messages, logprobs=True).json()["choices"][0]
    assert zero["logprobs"]["content"][0]["top_logprobs"] == [] and zero["finish_reason"] == "length"
    many = post(server, "chat/completions", messages=messages, logprobs=True, top_logprobs=3,
                allowed_token_ids=ids).json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    assert len(many) == 2  # min(top_logprobs, candidates)
    constrained = post(server, "chat/completions", messages=messages, allowed_token_ids=ids).json()["choices"][0]
    assert constrained["logprobs"] is None and constrained["message"]["content"] in ("true", "false")


def test_chat_scoring_extra_messages(server):
    a = [{"role": "user", "content": "Say yes."}]
    b = [{"role": "user", "content": "Say no."}]
    r = post(server, "chat/completions", messages=a, logprobs=True, top_logprobs=1, extra_messages=[b]).json()
    assert [c["index"] for c in r["choices"]] == [0, 1]
    alone = post(server, "chat/completions", messages=b, logprobs=True, top_logprobs=1).json()
    assert r["choices"][1]["logprobs"] == alone["choices"][0]["logprobs"]
    bad = post(server, "chat/completions", messages=a, logprobs=True, extra_messages=[b, [{"role": "user",
                                                                                        "content": "w " * 9000}]])
    assert bad.status_code == 400 and "extra_messages[1]" in bad.json()["error"]["message"]
    assert bad.json()["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("route,body,status,code,param", [
    ("completions", {"prompt": "x", "logprobs": 1, "allowed_token_ids": [10**6]}, 400, "invalid_scoring_request",
     "allowed_token_ids"),
    ("completions", {"prompt": "", "logprobs": 1, "add_special_tokens": False}, 400, "invalid_scoring_request",
     "prompt"),
    ("completions", {"prompt": "x", "logprobs": 1, "temperature": 0.0005}, 400, "invalid_parameter", "temperature"),
    ("completions", {"prompt": "x", "logprobs": 21}, 400, "invalid_parameter", "logprobs"),
    ("completions", {"prompt": "x", "logprobs": 1, "max_tokens": 2}, 400, "invalid_parameter", "max_tokens"),
    ("completions", {"prompt": "x", "logprobs": 1, "max_tokens": None, "max_completion_tokens": 3}, 400,
     "invalid_parameter", "max_completion_tokens"),
    ("completions", {"prompt": "x", "logprobs": 1, "stream": True}, 400, "invalid_parameter", "stream"),
    ("completions", {"prompt": "x", "logprobs": 1, "response_format": {"type": "json_object"}}, 400,
     "field_not_honoured", "response_format"),
    ("completions", {"prompt": "x", "logprobs": 1, "top_logprobs": 2}, 400, "field_not_honoured", "top_logprobs"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "profile": "p"}, 400,
     "field_not_honoured", "profile"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True,
                          "steering_intensity": 1.0}, 400, "field_not_honoured", "steering_intensity"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "n": 2}, 400,
     "invalid_parameter", "n"),
])
def test_scoring_refusals(server, route, body, status, code, param):
    r = post(server, route, **body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code and r.json()["error"]["param"] == param


def test_non_finite_logits_from_the_model(server, engine):
    import torch

    ids = engine.tokenizer(PROMPT)["input_ids"]
    victim = next(i for i in range(1000, 2000) if i not in ids)
    other = next(i for i in range(2000, 3000) if i not in ids)
    # the output layer gives the victim token a NaN logit (its weights are packed on the CPU, so the NaN is
    # put in its output, not its weight)
    nan = torch.tensor([victim])
    handle = engine.model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: out.index_fill(-1, nan, float("nan")))
    try:
        hit = post(server, "completions", prompt=PROMPT, logprobs=1, allowed_token_ids=[victim, other])
        assert hit.status_code == 500 and hit.json()["error"]["code"] == "non_finite_logits"
        assert post(server, "completions", prompt=PROMPT, logprobs=1).status_code == 500
        assert post(server, "completions", prompt=PROMPT, logprobs=1, allowed_token_ids=[other]).status_code == 200
    finally:
        handle.remove()


def test_scoring_is_never_steered_or_monitored(server, engine, tmp_path):
    from tests.support.saes import random_sae

    plain = post(server, "completions", prompt=PROMPT, logprobs=5).json()["choices"][0]["logprobs"]
    engine.steering.attach("sae_scoring", random_sae(576, 64, seed=9), 5)
    engine.steering.set_values("sae_scoring", {3: 150.0}, merge=False)
    from millm.steering.monitor import MonitorConfig

    engine.monitor.configure(MonitorConfig(True, "sae_scoring", [1, 2, 3], 10))
    try:
        steered_gen = post(server, "completions", prompt=PROMPT, max_tokens=3, temperature=0)
        assert steered_gen.headers["X-miLLM-Steering"] == "live"
        recorded = len(engine.monitor.history)
        r = post(server, "completions", prompt=PROMPT, logprobs=5)
        assert r.headers["X-miLLM-Steering"] == "none"
        assert r.json()["choices"][0]["logprobs"] == plain
        chat = post(server, "chat/completions", messages=[{"role": "user", "content": "hi"}], logprobs=True)
        assert chat.headers["X-miLLM-Steering"] == "none"
        assert len(engine.monitor.history) == recorded
    finally:
        engine.monitor.configure(MonitorConfig())
        engine.steering.detach("sae_scoring")


def test_scoring_headers(server):
    r = post(server, "completions", prompt=PROMPT, logprobs=1, seed=5, top_p=0.5, stop=["x"])
    assert r.headers["X-miLLM-Seed"] == '5;scope="request"'
    assert r.headers["X-miLLM-Ignored-Fields"] == '"top_p", "stop"'
