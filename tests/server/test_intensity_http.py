"""Clusters, circuits and the steering dial over HTTP on the bundled model (issue 12).

Two random SAEs at layers 10 and 20 stand in for trained ones: what is tested is which strengths run,
which the answers show byte for byte (greedy decoding), and what the headers say.
"""

import json
import re
import sqlite3
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support.live import live_server
from tests.support.saes import random_sae, write_saelens
from tests.support.waiting import wait_running

MODEL = "SmolLM2-135M-Instruct"
PROMPT = [{"role": "user", "content": "Write one sentence about the weather."}]
LONG = [{"role": "user", "content": "Count from 1 to 300, separated by commas."}]
D_SAE = 256
STRONG = 70.0  # per member; four members change the greedy answer, at λ 2 certainly
INTENSITY, RUNG = "X-miLLM-Steering-Intensity", "X-miLLM-Circuit-Rung"


@pytest.fixture(scope="module")
def base(engine, settings):
    from millm.server.app import create_app

    with live_server(create_app(settings, engine)) as url:
        yield url


@pytest.fixture(scope="module")
def saes(base, tmp_path_factory):
    """SAE ids at layers 10 and 20, attached."""
    root = tmp_path_factory.mktemp("dial-saes")
    ids = {}
    for layer, seed in ((10, 21), (20, 22)):
        folder = write_saelens(root / f"l{layer}", random_sae(576, D_SAE, seed=seed), layer=layer)
        r = httpx.post(base + "/api/saes", json={"path": str(folder)}, timeout=30)
        assert r.status_code == 201, r.text
        ids[layer] = r.json()["id"]
    yield ids
    httpx.delete(base + "/api/steering", timeout=30)
    for sid in ids.values():
        httpx.post(base + f"/api/saes/{sid}/detach", timeout=30)


def attach_all(base, saes):
    for layer, sid in saes.items():
        r = httpx.post(base + f"/api/saes/{sid}/attach", json={"layer": layer}, timeout=30)
        assert r.status_code == 200, r.text


@pytest.fixture(autouse=True)
def reset(base, saes):
    """Every test starts and ends with both SAEs attached, no values, steering enabled, nothing active."""
    attach_all(base, saes)
    httpx.delete(base + "/api/steering", timeout=30)
    httpx.post(base + "/api/steering/enable", timeout=30)
    yield
    attach_all(base, saes)
    httpx.delete(base + "/api/steering", timeout=30)
    httpx.post(base + "/api/steering/enable", timeout=30)


def cluster_doc(name, layer=10, features=(1, 2, 3, 4), strength=STRONG, **extra):
    return {"kind": "cluster", "name": name, "model": MODEL, "description": "test cluster",
            "sae": {"layer": layer, "d_sae": D_SAE},
            "members": [{"feature": f, "strength": strength, "label": f"f{f}"} for f in features], **extra}


def circuit_doc(name, fallback="dial-fallback", rung=2, **extra):
    members = [{"layer": 10, "feature": f, "strength": STRONG} for f in (1, 2)]
    members += [{"layer": 20, "feature": f, "strength": STRONG} for f in (5, 6)]
    doc = {"kind": "circuit", "name": name, "model": MODEL, "members": members,
           "evidence": {"rung": rung, "method": "test"}, **extra}
    if fallback is not None:
        doc["fallback_cluster"] = fallback
    return doc


def import_doc(base, kind, doc):
    r = httpx.post(base + f"/api/{kind}s/import", params={"overwrite": "true"}, json=doc, timeout=30)
    assert r.status_code == 201, r.text
    return r.json()


@pytest.fixture(scope="module")
def docs(base, saes):
    """A cluster on layer 10, the circuit's fallback cluster, and circuits with and without a fallback."""
    import_doc(base, "cluster", cluster_doc("dial-cluster"))
    import_doc(base, "cluster", cluster_doc("dial-ranged", intensity_range=[0.5, 1.5]))
    import_doc(base, "cluster", cluster_doc("dial-fallback", features=(1, 2, 7)))
    import_doc(base, "circuit", circuit_doc("dial-circuit"))
    import_doc(base, "circuit", circuit_doc("dial-orphan", fallback=None, rung=1))
    return {"cluster": "dial-cluster", "ranged": "dial-ranged", "fallback": "dial-fallback",
            "circuit": "dial-circuit", "orphan": "dial-orphan"}


def chat(base, **body):
    body = {"model": MODEL, "messages": PROMPT, "max_tokens": 6, "temperature": 0} | body
    return httpx.post(base + "/v1/chat/completions", json=body, timeout=120)


def head(base, **body):
    """A one-token answer, for its headers."""
    return chat(base, **({"max_tokens": 1} | body))


def text(r):
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def error(r, status=400):
    assert r.status_code == status, r.text
    return r.json()["error"]


SF_STRING = r'"(?:[ !#-\[\]-~]|\\["\\])*"'
SF_TOKEN = r"[A-Za-z*][!#$%&'*+.^_`|~0-9A-Za-z:/-]*"
SF_BARE = rf"(?:-?[0-9]{{1,15}}(?:\.[0-9]{{1,3}})?|{SF_STRING}|{SF_TOKEN}|\?[01])"
SF_PARAM = rf";\s*([a-z*][a-z0-9_.*-]*)(?:=({SF_BARE}))?"


def parse_sf_item(value):
    """An RFC 8941 Item (bare item with parameters) -> (bare item, {key: value}); ValueError if malformed."""
    m = re.fullmatch(rf"({SF_BARE})((?:{SF_PARAM})*)", value)
    if m is None:
        raise ValueError(f"not an RFC 8941 item: {value!r}")

    def bare(token):
        if token is None:
            return True
        if token.startswith('"'):
            return re.sub(r'\\(["\\])', r"\1", token[1:-1])
        if token.startswith("?"):
            return token == "?1"
        if re.fullmatch(r"-?[0-9]+", token):
            return int(token)
        if re.fullmatch(r"-?[0-9.]+", token):
            return float(token)
        return token

    return bare(m.group(1)), {k: bare(v) for k, v in re.findall(SF_PARAM, m.group(2))}


def rung_of(r):
    return parse_sf_item(r.headers[RUNG]) if RUNG in r.headers else None


def test_the_rung_parser_is_strict():
    assert parse_sf_item('2; language="causally validated (edge)"') == (2, {"language": "causally validated (edge)"})
    for bad in ('2; language=causally validated', '2;language="a"b"', "two words", '2; Language="x"', ""):
        with pytest.raises(ValueError):
            parse_sf_item(bad)


def test_a_cluster_dialled_to_zero_answers_unsteered_and_to_two_differs(base, docs):
    plain = chat(base)
    off = chat(base, profile=docs["cluster"], steering_intensity=0)
    assert text(off) == text(plain)
    assert off.headers[INTENSITY] == "0.0" and off.headers["X-miLLM-Steering"] == "none"
    off_word = chat(base, profile=docs["cluster"], steering_intensity="off")
    assert text(off_word) == text(plain) and off_word.headers[INTENSITY] == "0.0"
    two = chat(base, profile=docs["cluster"], steering_intensity=2)
    assert text(two) != text(plain)
    assert two.headers[INTENSITY] == "2.0" and two.headers["X-miLLM-Steering"] == f'"{docs["cluster"]}"'
    assert RUNG not in two.headers and INTENSITY not in plain.headers


def test_stored_dial_and_the_per_request_override(base, docs):
    name = docs["cluster"]
    plain, at_one = text(chat(base)), chat(base, profile=name, steering_intensity=1)
    try:
        r = httpx.put(base + f"/api/clusters/{name}/intensity", json={"lambda": 0}, timeout=30)
        assert r.status_code == 200 and r.json()["intensity"] == 0.0 and r.json()["live"] is True
        stored = chat(base, profile=name)
        assert text(stored) == plain and INTENSITY not in stored.headers  # the stored dial, nothing to echo
        overridden = chat(base, profile=name, steering_intensity=1.0)
        assert text(overridden) == text(at_one) != plain and overridden.headers[INTENSITY] == "1.0"
        assert httpx.get(base + f"/api/clusters/{name}", timeout=10).json()["intensity"] == 0.0  # request only
        httpx.put(base + f"/api/clusters/{name}/intensity", json={"lambda": 1}, timeout=30)
        assert text(chat(base, profile=name)) == text(at_one)
    finally:
        httpx.put(base + f"/api/clusters/{name}/intensity", json={"lambda": 1}, timeout=30)


@pytest.mark.parametrize("name,value,needle", [
    ("dial-cluster", 2.5, "from 0 to 2"), ("dial-cluster", -0.1, "from 0 to 2"),
    ("dial-ranged", 1.6, "from 0 to 1.5"), ("dial-cluster", "1", "lambda"), ("dial-cluster", None, "lambda"),
])
def test_stored_dial_bounds(base, docs, name, value, needle):
    body = {} if value is None else {"lambda": value}
    err = error(httpx.put(base + f"/api/clusters/{name}/intensity", json=body, timeout=30))
    assert err["code"] == "invalid_parameter" and err["param"] == "lambda" and needle in err["message"]
    assert httpx.get(base + f"/api/clusters/{name}", timeout=10).json()["intensity"] == 1.0
    assert httpx.put(base + "/api/clusters/never/intensity", json={"lambda": 1}, timeout=30).status_code == 404


def test_symbols_against_a_declared_range(base, docs):
    name = docs["ranged"]
    assert head(base, profile=name, steering_intensity="min").headers[INTENSITY] == "0.5"
    assert head(base, profile=name, steering_intensity="max").headers[INTENSITY] == "1.5"
    capped = chat(base, profile=name, steering_intensity=1.9)
    assert capped.headers[INTENSITY] == "1.5"
    assert text(capped) == text(chat(base, profile=docs["cluster"], steering_intensity=1.5))
    assert head(base, profile=name, steering_intensity=0.1).headers[INTENSITY] == "0.1"  # below the floor: honoured


@pytest.mark.parametrize("value", [2.5, -1, "0.5", "maximum", True, "OFF"])
def test_invalid_steering_intensity(base, docs, value):
    err = error(chat(base, profile=docs["cluster"], steering_intensity=value))
    assert err["code"] == "invalid_parameter" and err["param"] == "steering_intensity"


def test_steering_intensity_refused_where_the_table_refuses_it(base, docs):
    r = httpx.post(base + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2,
                                                   "steering_intensity": 1.0}, timeout=30)
    assert error(r)["code"] == "field_not_honoured" and error(r)["param"] == "steering_intensity"
    r = chat(base, steering_intensity=1.0, logprobs=True, max_tokens=1)
    assert error(r)["code"] == "field_not_honoured" and error(r)["param"] == "steering_intensity"


def test_the_echo_is_omitted_when_the_dial_changes_nothing(base, saes, docs):
    assert INTENSITY not in head(base, steering_intensity=1.5).headers  # empty base: no live values
    httpx.put(base + "/api/steering", json={"sae": saes[10], "values": {"3": STRONG}}, timeout=30)
    live = chat(base, steering_intensity=0.5)
    assert live.headers[INTENSITY] == "0.5" and live.headers["X-miLLM-Steering"] == "live"
    httpx.post(base + "/api/steering/disable", timeout=30)
    disabled = chat(base, steering_intensity=0.5)
    assert INTENSITY not in disabled.headers and disabled.headers["X-miLLM-Steering"] == "none"
    assert head(base, profile=docs["cluster"], steering_intensity=0.5).headers[INTENSITY] == "0.5"  # named: applies
    httpx.post(base + "/api/steering/enable", timeout=30)
    for sid in saes.values():
        httpx.post(base + f"/api/saes/{sid}/detach", timeout=30)
    assert INTENSITY not in head(base, steering_intensity=0.5).headers
    none_attached = chat(base, profile=docs["cluster"], steering_intensity=0.5)
    assert INTENSITY not in none_attached.headers and none_attached.headers["X-miLLM-Steering"] == "none"
    assert error(chat(base, profile="never-saved", steering_intensity=0.5), 404)["code"] == "profile_not_found"


def test_live_values_and_plain_profiles_scale_like_a_cluster_without_a_range(base, saes, docs):
    values = {"1": STRONG, "2": STRONG, "3": STRONG, "4": STRONG}
    httpx.put(base + "/api/steering", json={"sae": saes[10], "values": values}, timeout=30)
    at_half = chat(base, steering_intensity=0.5)
    assert text(at_half) == text(chat(base, profile=docs["cluster"], steering_intensity=0.5))
    assert head(base, steering_intensity="min").headers[INTENSITY] == "0.5"  # MILLM_CLUSTER_INTENSITY_MIN
    assert head(base, steering_intensity="max").headers[INTENSITY] == "2.0"  # MILLM_INTENSITY_MAX
    assert httpx.get(base + "/api/steering", timeout=10).json()["saes"][saes[10]]["values"] == values


def test_rung_header_on_a_native_circuit(base, docs):
    plain = text(chat(base))
    r = chat(base, profile=docs["circuit"], steering_intensity=1.0)
    assert rung_of(r) == (2, {"language": "causally validated (edge)"})
    assert r.headers[INTENSITY] == "1.0" and r.headers["X-miLLM-Steering"] == f'"{docs["circuit"]}"'
    assert text(r) != plain
    no_dial = chat(base, profile=docs["circuit"])
    assert rung_of(no_dial)[0] == 2 and INTENSITY not in no_dial.headers
    off = chat(base, profile=docs["circuit"], steering_intensity="off")
    assert RUNG not in off.headers and text(off) == plain
    low = chat(base, profile=docs["circuit"], steering_intensity="min")  # no declared range: min is off
    assert low.headers[INTENSITY] == "0.0" and RUNG not in low.headers
    assert RUNG not in head(base, profile=docs["cluster"]).headers
    streamed = chat(base, profile=docs["circuit"], steering_intensity=0.5, stream=True)
    assert rung_of(streamed)[0] == 2 and streamed.headers[INTENSITY] == "0.5"


def test_rung_header_for_the_active_circuit(base, saes, docs):
    name = docs["circuit"]
    assert RUNG not in head(base).headers  # no active circuit
    r = httpx.post(base + f"/api/circuits/{name}/activate", timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["active"] == name and r.json()["steering"]["mode"] == "native"
    assert set(r.json()["saes"][saes[20]]["values"]) == {"5", "6"}
    active = httpx.get(base + "/api/circuits/active", timeout=10).json()
    assert active["active"] == name
    assert {k: active["steering"][k] for k in ("mode", "rung", "language")} == \
        {"mode": "native", "rung": 2, "language": "causally validated (edge)"}
    steered = chat(base)
    assert rung_of(steered) == (2, {"language": "causally validated (edge)"})
    assert steered.headers["X-miLLM-Steering"] == f'"{name}"'
    assert text(steered) == text(chat(base, profile=name))
    assert rung_of(head(base, steering_intensity=1.2))[0] == 2
    assert RUNG not in head(base, steering_intensity=0).headers
    assert RUNG not in head(base, profile=docs["cluster"]).headers  # another profile steers this one
    httpx.post(base + "/api/steering/disable", timeout=30)
    assert RUNG not in head(base).headers
    httpx.post(base + "/api/steering/enable", timeout=30)
    httpx.put(base + "/api/steering", json={"sae": saes[10], "values": {"9": 3.0}}, timeout=30)
    assert RUNG not in head(base).headers  # the operator's values replaced the circuit's
    assert httpx.get(base + "/api/circuits/active", timeout=10).json()["active"] is None


def test_slice_fallback_serving(base, saes, docs):
    name = docs["circuit"]
    httpx.post(base + f"/api/saes/{saes[20]}/detach", timeout=30)
    fallback = chat(base, profile=docs["fallback"])
    served = chat(base, profile=name)
    assert text(served) == text(fallback) != text(chat(base))
    assert RUNG not in served.headers and served.headers["X-miLLM-Steering"] == f'"{name}"'
    # the backing cluster's rule, 0.5 floor included (a native circuit without a range has floor 0)
    assert head(base, profile=name, steering_intensity="min").headers[INTENSITY] == "0.5"
    assert head(base, profile=name, steering_intensity=0.2).headers[INTENSITY] == "0.2"
    assert text(chat(base, profile=name, steering_intensity=0.7)) == \
        text(chat(base, profile=docs["fallback"], steering_intensity=0.7))
    shown = httpx.get(base + f"/api/circuits/{name}", timeout=10).json()["steering"]
    assert shown["mode"] == "slice_fallback" and shown["rung"] is None and "layer 20" in shown["reason"]
    httpx.post(base + f"/api/circuits/{name}/activate", timeout=30)
    state = httpx.get(base + "/api/circuits/active", timeout=10).json()["steering"]
    assert (state["mode"], state["rung"], state["language"]) == ("slice_fallback", None, None)
    assert RUNG not in head(base).headers and text(chat(base)) == text(fallback)
    httpx.post(base + f"/api/saes/{saes[20]}/attach", json={"layer": 20}, timeout=30)  # natively again
    assert httpx.get(base + "/api/circuits/active", timeout=10).json()["steering"]["mode"] == "native"
    assert rung_of(head(base))[0] == 2 and text(chat(base)) == text(chat(base, profile=name))


def test_a_circuit_with_no_way_to_serve_does_not_steer(base, saes, docs):
    plain = text(chat(base))
    httpx.post(base + f"/api/saes/{saes[20]}/detach", timeout=30)
    r = chat(base, profile=docs["orphan"], steering_intensity=1.0)
    assert text(r) == plain and RUNG not in r.headers and INTENSITY not in r.headers
    shown = httpx.get(base + f"/api/circuits/{docs['orphan']}", timeout=10).json()["steering"]
    assert shown["mode"] == "none" and "no fallback_cluster" in shown["reason"]
    for sid in saes.values():
        httpx.post(base + f"/api/saes/{sid}/detach", timeout=30)
    assert RUNG not in head(base, profile=docs["circuit"]).headers  # no SAE on any member layer


def test_an_unparseable_stored_circuit_serves_none(base, settings, docs):
    import_doc(base, "circuit", circuit_doc("dial-broken"))
    assert rung_of(head(base, profile="dial-broken"))[0] == 2
    with sqlite3.connect(settings.home / "millm.db") as db:
        db.execute("UPDATE circuits SET document = ? WHERE name = ?", (json.dumps({"kind": "circuit"}), "dial-broken"))
    r = chat(base, profile="dial-broken", steering_intensity=1.0)
    assert r.status_code == 200 and RUNG not in r.headers and text(r) == text(chat(base))
    shown = httpx.get(base + "/api/circuits/dial-broken", timeout=10).json()["steering"]
    assert shown["mode"] == "none" and "does not parse" in shown["reason"]
    assert httpx.delete(base + "/api/circuits/dial-broken", timeout=30).status_code == 200


def until_content(lines):
    """Read the stream up to the first generated text."""
    for line in lines:
        if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
            return
    raise AssertionError("the stream ended before any text")


def test_an_sae_detached_mid_stream_ends_it_with_an_error_event(base, saes, docs, engine):
    import torch

    body = {"model": MODEL, "messages": LONG, "max_tokens": 400, "temperature": 0, "stream": True,
            "profile": docs["cluster"], "steering_intensity": 1.5}
    httpx.put(base + "/api/steering", json={"sae": saes[20], "values": {"8": 5.0}}, timeout=30)
    with httpx.Client(base_url=base, timeout=120) as http, http.stream("POST", "/v1/chat/completions",
                                                                        json=body) as stream:
        assert stream.headers[INTENSITY] == "1.5"
        lines = stream.iter_lines()
        until_content(lines)
        r = httpx.post(base + f"/api/saes/{saes[10]}/detach", timeout=30)
        assert r.status_code == 200 and r.json()["attached_layer"] is None
        rest = [line for line in lines if line]
    events = [i for i, line in enumerate(rest) if line == "event: error"]
    assert len(events) == 1, rest[-5:]
    body_err = json.loads(rest[events[0] + 1].removeprefix("data: "))["error"]
    assert body_err["code"] == "invalid_feature_index" and saes[10] in body_err["message"]
    assert rest[events[0] + 2:] == ["data: [DONE]"]
    state = httpx.get(base + "/api/steering", timeout=10).json()
    assert state["live"] is True and saes[10] not in state["saes"]
    assert state["saes"][saes[20]]["values"] == {"8": 5.0}  # exactly the operator's
    att = engine.steering.attachments[saes[20]]
    assert torch.allclose(att.delta, 5.0 * att.sae.W_dec[8])


def test_an_sae_replaced_mid_request_is_the_same_error_unstreamed(base, saes, docs):
    body = {"messages": LONG, "max_tokens": 400, "profile": docs["circuit"]}
    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(chat, base, **body)
        wait_running(base, job)
        r = httpx.post(base + f"/api/saes/{saes[20]}/attach", json={"layer": 20}, timeout=30)  # a new attachment
        assert r.status_code == 200
        err = error(job.result())
    assert err["code"] == "invalid_feature_index" and "replaced" in err["message"]
    assert httpx.get(base + "/api/steering", timeout=10).json()["live"] is True


def test_operator_wins_while_a_dialled_request_runs(base, saes, docs, engine):
    import torch

    httpx.put(base + "/api/steering", json={"sae": saes[10], "values": {"1": STRONG, "2": STRONG}}, timeout=30)
    body = {"model": MODEL, "messages": LONG, "max_tokens": 60, "temperature": 0, "stream": True,
            "steering_intensity": 0.5}
    with httpx.Client(base_url=base, timeout=120) as http, http.stream("POST", "/v1/chat/completions",
                                                                        json=body) as stream:
        assert stream.headers[INTENSITY] == "0.5" and stream.headers["X-miLLM-Steering"] == "live"
        lines = stream.iter_lines()
        until_content(lines)
        att = engine.steering.attachments[saes[10]]
        both = att.sae.W_dec[1] + att.sae.W_dec[2]
        assert att.rows is not None and any(torch.allclose(row, 0.5 * STRONG * both, atol=1e-4) for row in att.rows)
        assert torch.allclose(att.delta, STRONG * both, atol=1e-4)  # the request's row is dialled, the base is not
        r = httpx.put(base + "/api/steering", json={"sae": saes[10], "values": {"9": 4.0}}, timeout=30)
        assert r.status_code == 200 and r.json()["live"] is False
        dial = httpx.put(base + f"/api/clusters/{docs['cluster']}/intensity", json={"lambda": 0.8}, timeout=30)
        assert dial.status_code == 200 and dial.json()["live"] is False
        rest = [line for line in lines if line]
    assert "event: error" not in rest and rest[-1] == "data: [DONE]"
    after = httpx.get(base + "/api/steering", timeout=10).json()
    assert after["live"] is True and after["saes"][saes[10]]["values"] == {"9": 4.0}
    att = engine.steering.attachments[saes[10]]
    assert torch.allclose(att.delta, 4.0 * att.sae.W_dec[9])
    httpx.put(base + f"/api/clusters/{docs['cluster']}/intensity", json={"lambda": 1}, timeout=30)


def test_an_active_cluster_follows_its_dial(base, saes, docs):
    name = docs["cluster"]
    try:
        httpx.post(base + f"/api/profiles/{name}/activate", timeout=30)
        values = httpx.get(base + "/api/steering", timeout=10).json()["saes"][saes[10]]["values"]
        assert values == {str(f): STRONG for f in (1, 2, 3, 4)}
        r = httpx.put(base + f"/api/clusters/{name}/intensity", json={"lambda": 0.5}, timeout=30).json()
        assert r["active"] is True and r["live"] is True
        values = httpx.get(base + "/api/steering", timeout=10).json()["saes"][saes[10]]["values"]
        assert values == {str(f): STRONG * 0.5 for f in (1, 2, 3, 4)}
        assert text(chat(base)) == text(chat(base, profile=name, steering_intensity=0.5))
    finally:
        httpx.put(base + f"/api/clusters/{name}/intensity", json={"lambda": 1}, timeout=30)


@pytest.mark.parametrize("kind,edit,pointer,code", [
    ("cluster", lambda d: d["members"].__setitem__(1, {"feature": 300, "strength": 1.0}), "/members/1/feature",
     "invalid_feature_index"),
    ("cluster", lambda d: d.__setitem__("intensity_range", [1.5, 0.5]), "/intensity_range", "invalid_parameter"),
    ("cluster", lambda d: d.__setitem__("intensity_range", [0.5, 2.5]), "/intensity_range/1", "invalid_parameter"),
    ("cluster", lambda d: d["sae"].__setitem__("d_sae", 512), "/sae/d_sae", "invalid_parameter"),
    ("cluster", lambda d: d.__setitem__("name", "a/b"), "/name", "invalid_parameter"),
    ("circuit", lambda d: d["evidence"].__setitem__("rung", 4), "/evidence/rung", "invalid_parameter"),
    ("circuit", lambda d: d["members"][3].__setitem__("feature", 256), "/members/3/feature",
     "invalid_feature_index"),
    ("circuit", lambda d: d["members"][0].__setitem__("strength", "big"), "/members/0/strength",
     "invalid_parameter"),
])
def test_import_refusals_name_the_pointer(base, docs, kind, edit, pointer, code):
    doc = cluster_doc("dial-refused") if kind == "cluster" else circuit_doc("dial-refused")
    edit(doc)
    err = error(httpx.post(base + f"/api/{kind}s/import", json=doc, timeout=30))
    assert err["code"] == code and err["param"] == pointer and pointer in err["message"]
    assert httpx.get(base + f"/api/{kind}s/dial-refused", timeout=10).status_code == 404  # nothing half-imported
    assert httpx.get(base + "/api/profiles/dial-refused", timeout=10).status_code == 404


def test_documents_are_profiles_and_names_are_shared(base, saes, docs):
    assert httpx.post(base + "/api/clusters/import", json=cluster_doc("dial-cluster"), timeout=30).status_code == 409
    clash = httpx.post(base + "/api/circuits/import", json=circuit_doc("dial-cluster"), timeout=30)
    assert error(clash, 409)["code"] == "profile_exists"
    profile = httpx.get(base + "/api/profiles/dial-cluster", timeout=10).json()
    assert profile["entries"] == [{"sae": 10, "feature": f, "strength": STRONG} for f in (1, 2, 3, 4)]
    refused = httpx.put(base + "/api/profiles/dial-cluster", json={"entries": []}, timeout=30)
    assert error(refused, 409)["code"] == "profile_exists" and "cluster" in refused.json()["error"]["message"]
    import_doc(base, "cluster", cluster_doc("dial-doomed"))
    assert httpx.delete(base + "/api/profiles/dial-doomed", timeout=30).status_code == 200
    assert httpx.get(base + "/api/clusters/dial-doomed", timeout=10).status_code == 404
    listed = httpx.get(base + "/api/clusters", timeout=10).json()["data"]
    assert {"dial-cluster", "dial-ranged"} <= {c["name"] for c in listed}
    circuits = httpx.get(base + "/api/circuits", timeout=10).json()
    assert {c["name"]: c["steering"]["mode"] for c in circuits["data"]}["dial-circuit"] == "native"
    import_doc(base, "circuit", circuit_doc("dial-gone"))
    assert httpx.delete(base + "/api/circuits/dial-gone", timeout=30).json() == {"deleted": "dial-gone"}
    assert httpx.get(base + "/api/profiles/dial-gone", timeout=10).status_code == 404
    assert httpx.delete(base + "/api/circuits/dial-gone", timeout=30).status_code == 404


def test_routes_are_in_openapi_and_guarded_by_the_admin_key(base, engine, settings, docs):
    from millm.server.app import create_app

    paths = httpx.get(base + "/openapi.json", timeout=10).json()["paths"]
    for path in ("/api/clusters", "/api/clusters/import", "/api/clusters/{name}", "/api/clusters/{name}/intensity",
                 "/api/circuits", "/api/circuits/import", "/api/circuits/active", "/api/circuits/{name}",
                 "/api/circuits/{name}/activate"):
        assert path in paths, path
    assert "delete" in paths["/api/clusters/{name}"] and "put" in paths["/api/clusters/{name}/intensity"]
    with live_server(create_app(settings.model_copy(update={"admin_key": "boss"}), engine)) as guarded:
        assert httpx.get(guarded + "/api/clusters", timeout=10).status_code == 200
        assert httpx.get(guarded + "/api/circuits/active", timeout=10).status_code == 200
        denied = httpx.put(guarded + f"/api/clusters/{docs['cluster']}/intensity", json={"lambda": 0.3}, timeout=10)
        assert denied.status_code == 401
        assert httpx.post(guarded + "/api/circuits/import", json=circuit_doc("x"), timeout=10).status_code == 401
        assert httpx.delete(guarded + "/api/clusters/dial-cluster", timeout=10).status_code == 401
        allowed = httpx.put(guarded + f"/api/clusters/{docs['cluster']}/intensity", json={"lambda": 1.0},
                            headers={"Authorization": "Bearer boss"}, timeout=10)
        assert allowed.status_code == 200
