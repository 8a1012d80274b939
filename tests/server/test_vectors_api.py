"""The steering-vector management API (/api/vectors): sets listed, shown, attached, steered, deleted, imported and
exported as llama.cpp control vectors, and learned from examples as background jobs on the bundled model (few,
short examples: the mechanics, not the figure). Every refused body leaves nothing stored and starts no job."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from millm.config import Settings
from millm.store import Store
from tests.support.fakes import FakeEngine
from tests.support.waiting import wait_for

if TYPE_CHECKING:
    from millm.sae.vector_sets import VectorSet
    from millm.steering.service import SteeringService

MODEL = "SmolLM2-135M-Instruct"
D_MODEL, LAYER = 576, 10
POSITIVE = ["The rain fell all day.", "Dark clouds and heavy rain.", "It is raining again.", "Rain on the roof."]
NEGATIVE = ["The desk is made of oak.", "She counted the coins.", "A train left at noon.", "He read the letter."]


def call(server: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(method, server + path, timeout=120, **kwargs)


def unit_set(name: str, vectors: int = 1, layer: int = LAYER, seed: int = 0) -> VectorSet:
    import torch

    from millm.sae.vector_sets import VectorSet

    v = torch.randn(vectors, D_MODEL, generator=torch.Generator().manual_seed(seed))
    names = (name, *(f"{name}-{i}" for i in range(1, vectors)))
    return VectorSet(names, v / v.norm(dim=-1, keepdim=True), layer, MODEL, "diffmean", "mean",
                     {"positive": 3, "negative": 3}, "abc", {"concepts": ["test"]})


def service(settings: Settings) -> SteeringService:
    from millm.steering.service import SteeringService

    return SteeringService(Store(settings.home / "millm.db"))


def cleanup(server: str, *names: str) -> None:
    call(server, "DELETE", "/api/steering")
    for name in names:
        call(server, "DELETE", f"/api/vectors/{name}")  # detaches first


def listed(server: str) -> dict[str, Any]:
    r = call(server, "GET", "/api/vectors")
    assert r.status_code == 200, r.text
    return {s["id"]: s for s in r.json()["data"]}


def chat(server: str) -> httpx.Response:
    return call(server, "POST", "/v1/chat/completions", json={
        "model": MODEL, "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": "Hello."}]})


def wait_job(server: str, job_id: str) -> dict[str, Any]:
    """The job once it ended (polled, bounded by tests.support.waiting's deadline)."""
    seen: dict[str, Any] = {}

    def ended() -> bool:
        r = call(server, "GET", f"/api/vectors/jobs/{job_id}")
        assert r.status_code == 200, r.text
        seen.update(r.json())
        assert seen["status"] in ("queued", "running", "succeeded", "failed"), seen
        return seen["status"] in ("succeeded", "failed")

    wait_for(ended, f"learning job {job_id} to end", every=0.1)
    return seen


def test_a_stored_set_is_listed_shown_attached_steered_detached_and_deleted(server, settings):
    from millm.vectors import catalog

    name = "apivec"
    catalog.store(service(settings), settings.home, unit_set(name, vectors=2))
    try:
        row = listed(server)[name]
        assert row["names"] == [name, f"{name}-1"] and row["layer"] == LAYER and row["model"] == MODEL
        assert row["method"] == "diffmean" and row["examples"] == {"positive": 3, "negative": 3}
        assert row["attached_layer"] is None and row["format"] == "vectors"

        card = call(server, "GET", f"/api/vectors/{name}").json()
        assert [v["name"] for v in card["vectors"]] == [name, f"{name}-1"]
        assert all(v["norm"] == pytest.approx(1.0, abs=1e-5) for v in card["vectors"])

        attached = call(server, "POST", f"/api/vectors/{name}/attach", json={})
        assert attached.status_code == 200, attached.text
        assert attached.json()["attached_layer"] == LAYER
        assert attached.json() == call(server, "GET", f"/api/saes/{name}").json()  # the SAE route's answer
        assert listed(server)[name]["attached_layer"] == LAYER
        moved = call(server, "POST", f"/api/vectors/{name}/attach", json={"layer": 12})
        assert moved.status_code == 200 and moved.json()["attached_layer"] == 12

        steered = call(server, "PUT", "/api/steering", json={"sae": name, "values": {"1": 4.0}})
        assert steered.status_code == 200, steered.text
        assert steered.json()["saes"][name]["values"] == {"1": 4.0}
        r = chat(server)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
        past = call(server, "PUT", "/api/steering", json={"sae": name, "values": {"2": 4.0}})
        assert past.status_code == 400 and past.json()["error"]["code"] == "invalid_feature_index", past.text

        detached = call(server, "POST", f"/api/vectors/{name}/detach")
        assert detached.status_code == 200 and detached.json()["attached_layer"] is None
        assert detached.json() == call(server, "GET", f"/api/saes/{name}").json()

        call(server, "POST", f"/api/vectors/{name}/attach", json={})
        deleted = call(server, "DELETE", f"/api/vectors/{name}")  # attached: detached first, as an SAE is
        assert deleted.status_code == 200 and deleted.json() == {"deleted": name}
        assert not (settings.home / "vectors" / name).exists()
        for path in (f"/api/vectors/{name}", f"/api/saes/{name}"):
            gone = call(server, "GET", path)
            assert gone.status_code == 404 and gone.json()["error"]["code"] == "sae_not_found", gone.text
        assert name not in call(server, "GET", "/api/steering").json()["saes"]
        assert chat(server).status_code == 200
    finally:
        cleanup(server, name)


def test_sae_routes_and_vector_routes_keep_to_their_own(server):
    for method, path in (("GET", "/api/vectors/nosuchset"), ("POST", "/api/vectors/nosuchset/attach"),
                         ("POST", "/api/vectors/nosuchset/detach"), ("DELETE", "/api/vectors/nosuchset"),
                         ("GET", "/api/vectors/nosuchset/export")):
        r = call(server, method, path)
        assert r.status_code == 404 and r.json()["error"]["code"] == "sae_not_found", (method, path, r.text)
        assert "GET /api/vectors" in r.json()["error"]["message"]
    missing = call(server, "GET", "/api/vectors/jobs/job_nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "job_not_found", missing.text
    # the routes' own words are never read as a set's name
    for path in ("/api/vectors/learn", "/api/vectors/import"):
        assert call(server, "GET", path).status_code == 405
    assert call(server, "GET", "/api/vectors/jobs").status_code == 200


def test_learning_from_texts_is_a_job_whose_set_is_listed_and_steers(server, settings):
    name = "apilearn"
    before = len(call(server, "GET", "/api/vectors/jobs").json()["data"])
    try:
        r = call(server, "POST", "/api/vectors/learn", json={"name": name, "layer": LAYER, "positive": POSITIVE,
                                                               "negative": NEGATIVE})
        assert r.status_code == 202, r.text
        job = r.json()
        assert job["id"].startswith("job_") and job["status"] in ("queued", "running") and job["name"] == name
        assert r.headers["location"] == f"/api/vectors/jobs/{job['id']}"
        done = wait_job(server, job["id"])
        assert done["status"] == "succeeded", done
        assert done["vector_sets"] == [name] and done["layers"] == [LAYER]
        assert done["error"] is None and done["finished"] is not None

        row = listed(server)[name]
        assert row["layer"] == LAYER and row["method"] == "diffmean" and row["position"] == "mean"
        assert row["examples"] == {"positive": 4, "negative": 4} and row["model"] == MODEL
        assert call(server, "GET", f"/api/vectors/{name}").json()["vectors"][0]["norm"] == pytest.approx(1.0)
        jobs = call(server, "GET", "/api/vectors/jobs").json()["data"]
        assert len(jobs) == before + 1 and jobs[0]["id"] == job["id"]  # newest first

        assert call(server, "POST", f"/api/vectors/{name}/attach", json={}).json()["attached_layer"] == LAYER
        steered = call(server, "PUT", "/api/steering", json={"sae": name, "values": {"0": 8.0}})
        assert steered.status_code == 200, steered.text
        r = chat(server)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
        per_request = call(server, "POST", "/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi."}],
            "return_sae_activations": {"sae_id": name, "features": [0], "positions": "prompt"}})
        assert per_request.status_code == 200, per_request.text

        again = call(server, "POST", "/api/vectors/learn", json={"name": name, "positive": POSITIVE,
                                                                   "negative": NEGATIVE})
        assert again.status_code == 400 and again.json()["error"]["param"] == "name", again.text
    finally:
        cleanup(server, name)
    assert name not in listed(server) and not (settings.home / "vectors" / name).exists()


def test_uploaded_files_are_read_as_the_cli_reads_a_file_and_learn_the_same_vector(server, settings):
    """The console's file pickers send each file's text; the set equals the one learned from the same texts."""
    chats = "\n".join(json.dumps({"messages": [{"role": "user", "content": "Say it."},
                                              {"role": "assistant", "content": t}]}) for t in POSITIVE[:2])
    files = {"positive_file": {"name": "rain.jsonl", "text": chats + "\n\n" + "\n".join(POSITIVE[2:])},
             "negative_file": {"name": "other.txt", "text": "\n".join(NEGATIVE)}}
    try:
        for name, sides in (("apifiles", files), ("apitexts", {"positive": POSITIVE, "negative": NEGATIVE})):
            r = call(server, "POST", "/api/vectors/learn", json={"name": name, "layer": LAYER, **sides})
            assert r.status_code == 202, r.text
            assert wait_job(server, r.json()["id"])["status"] == "succeeded"
        import torch

        from millm.vectors.catalog import vector_set

        files_set, texts_set = (vector_set(service(settings), n)[1] for n in ("apifiles", "apitexts"))
        assert files_set.examples == {"positive": 4, "negative": 4} and files_set.sha256 == texts_set.sha256
        assert torch.equal(files_set.vectors, texts_set.vectors)
        assert files_set.source == {"given": "POST /api/vectors/learn", "files": ["rain.jsonl", "other.txt"]}
    finally:
        cleanup(server, "apifiles", "apitexts")


def test_learning_from_concepts_writes_examples_with_the_model(server):
    name = "apiconcept"
    try:
        r = call(server, "POST", "/api/vectors/learn", json={
            "name": name, "concepts": ["rain"], "examples": 6, "tokens": 16, "seed": 3, "method": "pca",
            "position": "last"})
        assert r.status_code == 202, r.text
        done = wait_job(server, r.json()["id"])
        assert done["status"] == "succeeded", done
        row = listed(server)[name]
        assert (row["method"], row["position"], row["layer"]) == ("pca", "last", 14)  # default_layer(30)
        assert row["source"] == {"concepts": ["rain"], "seed": 3, "tokens": 16, "negatives": "topics"}
        assert 2 <= row["examples"]["positive"] <= 6 and 2 <= row["examples"]["negative"] <= 6  # kept by mention
    finally:
        cleanup(server, name)


def test_a_job_over_several_layers_stores_one_set_per_layer(server):
    name = "apilayers"
    names = [f"{name}-L4", f"{name}-L5", f"{name}-L8"]
    try:
        r = call(server, "POST", "/api/vectors/learn", json={"name": name, "layer": ["4-5", 8],
                                                               "positive": POSITIVE, "negative": NEGATIVE})
        assert r.status_code == 202 and r.json()["layers"] == [4, 5, 8], r.text
        done = wait_job(server, r.json()["id"])
        assert done["status"] == "succeeded" and done["vector_sets"] == names, done
        rows = listed(server)
        assert [rows[n]["layer"] for n in names] == [4, 5, 8] and name not in rows
        taken = call(server, "POST", "/api/vectors/learn", json={"name": name, "layer": "5-6",
                                                                   "positive": POSITIVE, "negative": NEGATIVE})
        assert taken.status_code == 400 and f"'{name}-L5'" in taken.json()["error"]["message"], taken.text
    finally:
        for n in names:
            cleanup(server, n)


BAD_BODIES = [
    ({"positive": POSITIVE, "negative": NEGATIVE, "colour": "red"}, "colour", "unused_fields_refused"),
    ({"positive": POSITIVE, "negative": NEGATIVE, "method": "lda"}, "method", "invalid_parameter"),
    ({"positive": POSITIVE, "negative": NEGATIVE, "position": "first"}, "position", "invalid_parameter"),
    ({"positive": POSITIVE, "negative": NEGATIVE, "layer": 99}, "layer", "invalid_parameter"),
    ({"positive": POSITIVE, "negative": NEGATIVE, "layer": -1}, "layer", "invalid_parameter"),
    ({"positive": POSITIVE, "negative": NEGATIVE, "layer": "ten"}, "layer", "invalid_parameter"),
    ({"positive": POSITIVE, "negative": NEGATIVE, "layer": "12-10"}, "layer", "invalid_parameter"),
    ({"positive": POSITIVE, "negative": NEGATIVE, "layer": []}, "layer", "invalid_parameter"),
    ({"positive": POSITIVE, "negative": NEGATIVE, "layer": [True]}, "layer.0", "invalid_parameter"),
    ({"positive": POSITIVE, "negative": NEGATIVE, "negatives": "topics"}, "negatives", "invalid_parameter"),
    ({"concepts": ["rain"], "negatives": "others"}, "negatives", "invalid_parameter"),
    ({"concepts": ["rain"], "positive": POSITIVE, "negative": NEGATIVE}, "concepts", "invalid_parameter"),
    ({}, "concepts", "invalid_parameter"),
    ({"positive": POSITIVE}, "negative", "invalid_parameter"),
    ({"positive": "It rains.", "negative": NEGATIVE}, "positive", "invalid_parameter"),
    ({"positive": ["  "], "negative": NEGATIVE}, "positive", "invalid_parameter"),
    ({"positive": POSITIVE[:1], "negative": NEGATIVE, "method": "pca"}, "positive", "invalid_parameter"),
    ({"positive": POSITIVE, "negative": NEGATIVE, "examples": 8}, "examples", "invalid_parameter"),
    ({"concepts": ["rain"], "examples": 1}, "examples", "invalid_parameter"),
    ({"concepts": ["rain"], "tokens": 1000}, "tokens", "invalid_parameter"),
    ({"concepts": ["rain"], "seed": -1}, "seed", "invalid_parameter"),
    ({"concepts": []}, "concepts", "invalid_parameter"),
    ({"positive_file": {"name": "p.txt", "text": " \n"}, "negative": NEGATIVE}, "positive_file", "invalid_parameter"),
    ({"positive_file": {"name": "p.jsonl", "text": '{"x": 1}'}, "negative": NEGATIVE}, "positive_file",
     "invalid_parameter"),
    ({"positive_file": {"name": "p.txt"}, "negative": NEGATIVE}, "positive_file.text", "invalid_parameter"),
    ({"positive": POSITIVE, "negative": NEGATIVE, "negative_file": {"name": "n.txt", "text": "x"}}, "negative_file",
     "invalid_parameter"),
]


def test_a_refused_learning_body_stores_nothing_and_starts_no_job(server, settings, monkeypatch):
    import millm.server.vector_jobs as vector_jobs
    from millm.vectors import catalog

    monkeypatch.setattr(vector_jobs, "generated", lambda *a, **k: pytest.fail("examples were written"))
    monkeypatch.setattr(vector_jobs, "learn", lambda *a, **k: pytest.fail("a vector was learned"))
    taken = "apitaken"
    catalog.store(service(settings), settings.home, unit_set(taken))
    try:
        sets, jobs = listed(server), call(server, "GET", "/api/vectors/jobs").json()
        cases = [({**body, "name": "apibad"}, param, code) for body, param, code in BAD_BODIES] + [
            ({"name": taken, "positive": POSITIVE, "negative": NEGATIVE}, "name", "invalid_parameter"),
            ({"name": "bad/name", "positive": POSITIVE, "negative": NEGATIVE}, "name", "invalid_parameter"),
            ({"name": "learn", "positive": POSITIVE, "negative": NEGATIVE}, "name", "invalid_parameter"),
            ({"positive": POSITIVE, "negative": NEGATIVE}, "name", "invalid_parameter")]
        for body, param, code in cases:
            r = call(server, "POST", "/api/vectors/learn", json=body)
            assert r.status_code == 400, (body, r.text)
            error = r.json()["error"]
            assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error"), \
                (body, error)
        assert "'layer' must be between 0 and 29" in call(server, "POST", "/api/vectors/learn", json={
            "name": "apibad", "positive": POSITIVE, "negative": NEGATIVE, "layer": 30}).json()["error"]["message"]
        assert "already the id" in call(server, "POST", "/api/vectors/learn", json={
            "name": taken, "positive": POSITIVE, "negative": NEGATIVE}).json()["error"]["message"]
        assert listed(server) == sets and call(server, "GET", "/api/vectors/jobs").json() == jobs
        assert not (settings.home / "vectors" / "apibad").exists()
    finally:
        cleanup(server, taken)


def test_export_is_a_control_vector_and_import_takes_it_or_a_folder_back(server, settings, tmp_path):
    import torch

    from millm.sae import vector_sets
    from millm.vectors import catalog, gguf

    name, names = "apiexport", ["apiexport", "apiback", "apifolder", "apimulti-L5", "apimulti-L10", "apione"]
    original = unit_set(name, seed=4)
    catalog.store(service(settings), settings.home, original)
    try:
        r = call(server, "GET", f"/api/vectors/{name}/export")
        assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream", r.text
        assert r.headers["content-disposition"] == f'attachment; filename="{name}.gguf"'
        assert r.content[:4] == b"GGUF"
        file = tmp_path / "exported.gguf"
        file.write_bytes(r.content)

        back = call(server, "POST", "/api/vectors/import", json={"path": str(file), "name": "apiback"})
        assert back.status_code == 201, back.text
        [row] = back.json()["data"]
        assert (row["id"], row["layer"], row["method"], row["names"]) == ("apiback", LAYER, "imported", ["apiback"])
        stored = vector_sets.load(Path(row["path"]))
        assert torch.allclose(stored.vectors, original.vectors, atol=1e-6)
        assert listed(server)["apiback"]["attached_layer"] is None

        folder = tmp_path / "a-set"
        vector_sets.save(folder, unit_set("whatever", seed=5))
        wrong = call(server, "POST", "/api/vectors/import", json={"path": str(folder), "name": "apifolder",
                                                                    "layer": 3})
        assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "layer", wrong.text
        copied = call(server, "POST", "/api/vectors/import", json={"path": str(folder), "name": "apifolder"})
        assert copied.status_code == 201, copied.text
        assert copied.json()["data"][0]["names"] == ["apifolder"] and folder.exists()  # a copy: the source stays

        gguf.write(tmp_path / "multi.gguf", {5: torch.ones(D_MODEL), 10: -torch.ones(D_MODEL)}, MODEL)
        multi = call(server, "POST", "/api/vectors/import", json={"path": str(tmp_path / "multi.gguf"),
                                                                    "name": "apimulti"})
        assert multi.status_code == 201, multi.text
        assert [(s["id"], s["layer"]) for s in multi.json()["data"]] == [("apimulti-L5", 5), ("apimulti-L10", 10)]
        one = call(server, "POST", "/api/vectors/import", json={"path": str(tmp_path / "multi.gguf"),
                                                                  "name": "apione", "layer": 10})
        assert [(s["id"], s["layer"]) for s in one.json()["data"]] == [("apione", 10)], one.text

        sets = listed(server)
        (tmp_path / "junk.gguf").write_bytes(b"not a gguf")
        for body, param in (({"path": "/no/such/place.gguf", "name": "apinew"}, "path"),
                            ({"path": str(tmp_path / "junk.gguf"), "name": "apinew"}, "path"),
                            ({"path": str(tmp_path), "name": "apinew"}, "path"),
                            ({"path": str(file), "name": "apiback"}, "name"),
                            ({"path": str(file), "name": "apinew", "layer": 4}, "layer"),
                            ({"path": str(file), "name": "apinew", "mode": "copy"}, "mode")):
            r = call(server, "POST", "/api/vectors/import", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
        assert listed(server) == sets

        catalog.store(service(settings), settings.home, unit_set("apitwo", vectors=2))
        names.append("apitwo")
        two = call(server, "GET", "/api/vectors/apitwo/export")
        assert two.status_code == 400 and "one direction per layer" in two.json()["error"]["message"], two.text
    finally:
        cleanup(server, *names)


def run_app(tmp_path: Path, engine: Any, scenario: Any) -> Any:
    from millm.server.app import create_app

    app = create_app(Settings(home=tmp_path), engine)

    async def main() -> Any:
        async with app.test_app():
            return await scenario(app.test_client())
    return asyncio.run(main())


def test_learning_needs_a_loaded_model_that_reads_its_residual_stream(tmp_path):
    body = {"name": "v", "positive": POSITIVE, "negative": NEGATIVE}

    async def scenario(client):
        r = await client.post("/api/vectors/learn", json=body)
        return r.status_code, (await r.get_json())["error"]

    status, error = run_app(tmp_path / "none", None, scenario)
    assert (status, error["code"]) == (503, "model_not_loaded")
    status, error = run_app(tmp_path / "gguf", FakeEngine(engine_name="llama.cpp"), scenario)
    assert (status, error["code"], error["param"]) == (400, "field_not_honoured", "model")
    assert "transformers" in error["message"]


def test_the_routes_are_published_and_guarded(tmp_path):
    from millm.server.app import create_app

    app = create_app(Settings(home=tmp_path, admin_key="boss"), FakeEngine())  # type: ignore[arg-type]

    async def scenario():
        async with app.test_app():
            client = app.test_client()
            doc = await (await client.get("/openapi.json")).get_json()
            refused = await client.post("/api/vectors/learn", json={"name": "v", "concepts": ["x"]})
            deleted = await client.delete("/api/vectors/v")
            read = await client.get("/api/vectors")
            return doc, refused.status_code, deleted.status_code, read.status_code

    doc, refused, deleted, read = asyncio.run(scenario())
    paths = doc["paths"]
    for path in ("/api/vectors", "/api/vectors/{name}", "/api/vectors/{name}/attach", "/api/vectors/{name}/detach",
                 "/api/vectors/{name}/export", "/api/vectors/import", "/api/vectors/learn", "/api/vectors/jobs",
                 "/api/vectors/jobs/{job_id}"):
        assert path in paths, path
    body = doc["components"]["schemas"]["VectorsApiLearnVectorsBody"]
    assert body["additionalProperties"] is False and {"concepts", "positive", "negative"} <= set(body["properties"])
    assert "requestBody" in paths["/api/vectors/import"]["post"]
    assert (refused, deleted, read) == (401, 401, 200)


def test_one_job_learns_at_a_time():
    from millm.server.jobs import Table
    from millm.server.vector_jobs import KIND, LearnJobRunning, Plan, fields_of

    table = Table(KIND)
    fields = fields_of(Plan("v", (1,), "diffmean", "mean", concepts=("x",)))
    first = table.start(fields)
    with pytest.raises(LearnJobRunning) as refused:
        table.start(fields)
    assert refused.value.status == 409 and refused.value.code == "learn_job_running"
    assert first.id in refused.value.message and refused.value.param == "name"
