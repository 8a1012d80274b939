"""One rule for model names on every route (bare GGUF repo names included), the lock held by every load,
the model-id rule at registration, user paths that cannot be looked at, and bounded /metrics labels
(fast tier: a scripted engine and loader over the real registry)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from millm.config import Settings
from millm.engine.base import Engine
from millm.registry import ModelEntry, check_model_id, model_id_problem
from tests.support.fakes import FakeEngine

GGUF_ID = "tinyrepo:Q4_0"


class Server:
    """An app serving a scripted engine, with a GGUF file ``tinyrepo.Q4_0.gguf`` in MILLM_HOME/models."""

    def __init__(self, tmp_path: Path) -> None:
        from millm.server.app import create_app

        self.settings = Settings(home=tmp_path)
        self.settings.models_dir.mkdir(parents=True)
        (self.settings.models_dir / "tinyrepo.Q4_0.gguf").write_bytes(b"GGUF")
        self.loaded: list[str] = []
        self.app = create_app(self.settings, FakeEngine(), loader=self.load)
        self.app.extensions["millm"].manager.preflight = lambda target, current: None

    def load(self, target: ModelEntry, settings: Settings) -> Engine:
        self.loaded.append(target.id)
        return FakeEngine(target.id, engine_name=target.engine)  # type: ignore[return-value]

    def run(self, scenario: Any) -> Any:
        async def main() -> Any:
            async with self.app.test_app():
                return await scenario(self.app.test_client())
        return asyncio.run(main())


async def answer(response: Any) -> tuple[int, Any]:
    return response.status_code, await response.get_json()


def completion(model: str) -> dict[str, Any]:
    return {"model": model, "prompt": "hi", "max_tokens": 2}


def test_a_bare_gguf_name_resolves_alike_on_v1_models_the_lock_and_requests(tmp_path):
    server = Server(tmp_path)

    async def scenario(client):
        card = await answer(await client.get("/v1/models/tinyrepo"))
        locked = await answer(await client.post("/api/models/tinyrepo/lock"))
        listed = await answer(await client.get("/v1/models"))
        served = await answer(await client.post("/v1/completions", json=completion("tinyrepo")))
        again = await answer(await client.get("/v1/models/tinyrepo"))
        other = await answer(await client.post("/v1/completions", json=completion("SmolLM2-135M-Instruct")))
        return card, locked, listed, served, again, other

    card, locked, listed, served, again, other = server.run(scenario)
    assert card == (200, {**card[1], "id": GGUF_ID}), card
    assert locked[0] == 200 and locked[1]["id"] == GGUF_ID and locked[1]["locked"] is True
    assert [m["id"] for m in listed[1]["data"]] == [GGUF_ID]
    assert served[0] == 200, served  # the lock holds GGUF_ID: its bare name is that model too
    assert server.loaded == [GGUF_ID] and again[0] == 200 and again[1]["id"] == GGUF_ID
    assert other[0] == 409 and other[1]["error"]["code"] == "model_locked"


def test_a_management_load_keeps_to_the_lock(tmp_path):
    server = Server(tmp_path)

    async def scenario(client):
        await client.post("/api/models/fake/lock")
        refused = await answer(await client.post(f"/api/models/{GGUF_ID}/load"))
        await client.post("/api/models/fake/unlock")
        loaded = await answer(await client.post(f"/api/models/{GGUF_ID}/load"))
        return refused, loaded

    refused, loaded = server.run(scenario)
    assert refused[0] == 409 and refused[1]["error"]["code"] == "model_locked", refused
    assert loaded[0] == 200 and loaded[1]["state"] == "LOADED" and server.loaded == [GGUF_ID]


@pytest.mark.parametrize("model_id", ["a\r\nb", "a\nb", "nul\0id", "x" * 10_000, "x/load", "org/m/unlock",
                                      "", " lead", "trailing.", "a//b", "/abs", "tab\tid", "naïve"])
def test_model_ids_outside_the_rule_are_refused_at_registration(tmp_path, model_id):
    server = Server(tmp_path)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text("{}")

    async def scenario(client):
        refused = await answer(await client.post("/api/models", json={"path": str(folder), "id": model_id}))
        return refused, await answer(await client.get("/api/models"))

    (status, body), (_, listed) = server.run(scenario)
    assert status == 400 and body["error"]["param"] == "id", body
    assert all(m["id"] != model_id for m in listed["data"])


def test_the_id_rule_takes_hub_and_gguf_ids():
    for model_id in ("SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct", "repo:Q4_K_M", "a", "m_1.5b",
                     "org/name:BF16", "x/loader"):
        assert model_id_problem(model_id) is None, model_id
        assert check_model_id(model_id) == model_id


def test_a_folder_whose_name_breaks_the_rule_needs_an_id(tmp_path):
    server = Server(tmp_path)
    folder = tmp_path / "my model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")

    async def scenario(client):
        refused = await answer(await client.post("/api/models", json={"path": str(folder)}))
        named = await answer(await client.post("/api/models", json={"path": str(folder), "id": "my-model"}))
        return refused, named

    refused, named = server.run(scenario)
    assert refused[0] == 400 and refused[1]["error"]["param"] == "id"
    assert named[0] == 201 and named[1]["id"] == "my-model"


@pytest.mark.parametrize("path", ["~nosuchuser-millm-test", "~nosuchuser-millm-test/model", "/" + "p" * 5000,
                                  ("d" * 200 + "/") * 30])
def test_paths_the_system_cannot_look_at_are_a_400(tmp_path, path):
    server = Server(tmp_path)

    async def scenario(client):
        model = await answer(await client.post("/api/models", json={"path": path}))
        sae = await answer(await client.post("/api/saes", json={"path": path}))
        return model, sae

    model, sae = server.run(scenario)
    assert model[0] == 400 and model[1]["error"]["param"] == "path", model
    assert sae[0] == 400 and sae[1]["error"]["param"] == "path", sae


def test_unknown_http_methods_share_one_metrics_series(tmp_path):
    server = Server(tmp_path)

    async def scenario(client):
        for i in range(5):
            await client.open("/v1/models", method=f"BREW{i}")
        await client.open("/v1/models", method="get")
        return (await (await client.get("/metrics")).get_data()).decode()

    text = server.run(scenario)
    methods = {line.split('method="')[1].split('"')[0] for line in text.splitlines()
               if line.startswith("millm_requests_total{")}
    assert "BREW0" not in text and methods <= {"GET", "OTHER"} and "OTHER" in methods


def test_a_registered_model_with_malformed_files_is_refused_before_the_unload(tmp_path):
    """The real pre-load check: a 422 naming the file, and the loaded model keeps serving."""
    from millm.server.app import create_app

    settings = Settings(home=tmp_path)
    broken = (("badconfig", "{oops", None), ("badheader", "{}", b"\x10\0\0\0\0\0\0\0{not a header}"))
    for name, config, header in broken:
        folder = settings.models_dir / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(config)
        if header is not None:
            (folder / "model.safetensors").write_bytes(header)
    old = FakeEngine()
    app = create_app(settings, old)

    async def scenario(client):
        refused = [await answer(await client.post("/v1/completions", json=completion(name)))
                   for name in ("badconfig", "badheader")]
        admin = await answer(await client.post("/api/models/badconfig/load"))
        still = await answer(await client.post("/v1/completions", json=completion("fake")))
        return refused, admin, still

    async def main():
        async with app.test_app():
            return await scenario(app.test_client())

    refused, admin, still = asyncio.run(main())
    for (status, body), file in zip([*refused, admin], ("config.json", "model.safetensors", "config.json")):
        assert status == 422 and body["error"]["code"] == "invalid_model_files", body
        assert file in body["error"]["message"] and "Traceback" not in body["error"]["message"]
    assert still[0] == 200 and not old.closed


@pytest.mark.parametrize("model_id", ["a\r\nb", "nul\0", "x" * 200, "unlock"])
def test_a_pulled_models_id_follows_the_same_rule(model_id):
    from millm.errors import InvalidParameter
    from millm.hub import _plain_name

    with pytest.raises(InvalidParameter) as info:
        _plain_name(model_id)
    assert info.value.param == "id"


def test_user_paths_expand_as_a_shell_does():
    from millm.paths import user_path

    assert user_path("~nosuchuser-millm-test/x") == Path("~nosuchuser-millm-test/x")  # left as given
    assert user_path("~/x") == Path.home() / "x" and user_path("/abs") == Path("/abs")
