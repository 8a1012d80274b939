"""Nothing one request brings holds the server: model files that block on open, a registry another process
holds, a prompt of millions of characters. Each is refused (or times out) on its own threads while every
other route answers (fast tier: scripted engine and preflight, real files)."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from millm import registry
from millm.config import Settings
from millm.engine import preflight
from millm.errors import InvalidModelFiles
from millm.registry import ModelEntry
from tests.support.fakes import FakeEngine


def checkpoint(folder: Path) -> ModelEntry:
    folder.mkdir(parents=True, exist_ok=True)
    return ModelEntry(id=folder.name, engine="transformers", source="path", path=folder)


def test_a_directory_named_like_weights_is_invalid_model_files(tmp_path):
    entry = checkpoint(tmp_path / "ckpt")
    (entry.path / "config.json").write_text("{}")
    (entry.path / "model.safetensors").mkdir()
    with pytest.raises(InvalidModelFiles, match="is a directory"):
        preflight.footprint(entry, 2)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_fifo_is_refused_without_being_opened(tmp_path, name):
    entry = checkpoint(tmp_path / "ckpt")
    if name != "config.json":
        (entry.path / "config.json").write_text("{}")
    os.mkfifo(entry.path / name)  # opening it for reading would block until a writer came
    with pytest.raises(InvalidModelFiles, match="is a FIFO"):
        preflight.footprint(entry, 2)


def test_a_gguf_path_that_is_a_fifo_is_refused(tmp_path):
    path = tmp_path / "model.Q4_0.gguf"
    os.mkfifo(path)
    entry = ModelEntry(id="m:Q4_0", engine="llama.cpp", source="path", path=path)
    with pytest.raises(InvalidModelFiles, match="is a FIFO"):
        preflight.footprint(entry, 2)


def run(app: Any, scenario: Any) -> Any:
    async def main() -> Any:
        async with app.test_app():
            return await scenario(app.test_client())
    return asyncio.run(main())


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def test_a_load_whose_files_never_answer_times_out_while_other_routes_answer(tmp_path):
    from millm.server.app import create_app

    hung = threading.Event()
    entries = {"fake": checkpoint(tmp_path / "fake"), "stuck": checkpoint(tmp_path / "stuck")}
    app = create_app(Settings(home=tmp_path / "home", preflight_timeout=0.5), FakeEngine(),
                     registry=lambda name: entries[name])
    manager = app.extensions["millm"].manager
    manager.preflight = lambda entry, current: hung.wait(30)  # a file on a mount that does not answer

    async def scenario(client):
        load = asyncio.ensure_future(client.post("/v1/chat/completions", json=chat("stuck")))
        await asyncio.sleep(0.1)
        health = await client.get("/api/health")
        models = await client.get("/v1/models")
        refused = await load
        return health.status_code, models.status_code, refused.status_code, await refused.get_json()

    try:
        health, models, status, body = run(app, scenario)
    finally:
        hung.set()
    assert (health, models) == (200, 200)
    assert status == 500 and body["error"]["code"] == "model_load_failed"
    message = body["error"]["message"]
    assert "did not answer within 0.5 s" in message and "nothing was unloaded" in message
    assert manager.engine is not None and manager.engine.model_id == "fake"  # the old model still serves


def test_registration_waits_for_another_process_off_the_event_loop(tmp_path, monkeypatch):
    from millm.server.app import create_app

    monkeypatch.setattr(registry, "REGISTRY_LOCK_WAIT", 1.0)
    settings = Settings(home=tmp_path / "home")
    app = create_app(settings, FakeEngine())
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    lock_file = settings.home / "models.json.lock"
    lock_file.parent.mkdir(parents=True, exist_ok=True)

    async def scenario(client):
        register = asyncio.ensure_future(client.post("/api/models", json={"path": str(model)}))
        await asyncio.sleep(0.2)
        health = await client.get("/api/health")  # answered while the registration waits for the lock
        refused = await register
        return health.status_code, register.done(), refused.status_code, await refused.get_json()

    with open(lock_file, "a") as held:  # what another `millm models add` holds while it writes
        fcntl.flock(held, fcntl.LOCK_EX)
        health, _, status, body = run(app, scenario)
    assert health == 200
    assert status == 503 and body["error"]["code"] == "model_busy" and "registry" in body["error"]["message"]


def test_a_prompt_too_long_in_characters_is_refused_before_it_is_tokenised(tmp_path):
    from millm.server.app import create_app

    engine = FakeEngine(context_window=64)
    tokenised: list[object] = []
    real = engine.tokenize
    engine.tokenize = lambda prompt: tokenised.append(prompt) or real(prompt)  # type: ignore[method-assign]
    app = create_app(Settings(home=tmp_path), engine)
    limit = 64 * engine.max_token_bytes

    async def scenario(client):
        chat_body = {**chat("fake"), "messages": [{"role": "user", "content": "x" * limit}]}  # and "user"
        completion = {"model": "fake", "prompt": "y" * (limit + 1), "max_tokens": 1}
        out = []
        for route, body in (("/v1/chat/completions", chat_body), ("/v1/completions", completion)):
            r = await client.post(route, json=body)
            out.append((r.status_code, await r.get_json()))
        return out

    (chat_status, chat_error), (text_status, text_error) = run(app, scenario)
    for status, body, chars in ((chat_status, chat_error, limit + 4), (text_status, text_error, limit + 1)):
        assert status == 400 and body["error"]["code"] == "context_length_exceeded"
        assert f"holds {chars} characters" in body["error"]["message"]
        assert f"at least {-(-chars // engine.max_token_bytes)} tokens" in body["error"]["message"]
    assert tokenised == []
