"""/api/vectors on the scripted engine (issue 49): every malformed folder or control-vector GGUF an import is given
is a 400 naming the path as the client gave it and the key, storing and registering nothing; a set of any finite
non-zero norm is stored at unit norm; listing and deleting work from the registry, so a damaged or removed set
neither hides the others nor resists removal."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from millm.config import Settings
from tests.support.fakes import FakeEngine
from tests.support.malformed import (
    FOLDERS,
    GGUFS,
    LAYERS,
    D,
    empty_strings_gguf,
    gguf_file,
    unit_rows,
    write_folder,
)

Scenario = Callable[[Any], Awaitable[Any]]


def run_app(home: Path, scenario: Scenario, engine: Any = None) -> Any:
    """``scenario(client)`` against the app on a steerable scripted engine (30 layers of width 576)."""
    from millm.server.app import create_app

    app = create_app(Settings(home=home), engine if engine is not None else FakeEngine(steerable=True))

    async def main() -> Any:
        async with app.test_app():
            return await scenario(app.test_client())
    return asyncio.run(main())


def importing(body: dict[str, Any]) -> Scenario:
    """Import ``body``; answers the status, the JSON body, and the sets then listed."""
    async def scenario(client: Any) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
        r = await client.post("/api/vectors/import", json=body)
        listed = await (await client.get("/api/vectors")).get_json()
        return r.status_code, await r.get_json(), listed["data"]
    return scenario


def refused_cleanly(home: Path, status: int, answer: dict[str, Any], listed: list[dict[str, Any]]) -> str:
    """The refusal's message, once the answer is a 400 invalid_parameter on ``path`` and nothing was stored."""
    assert status == 400, answer
    assert (answer["error"]["code"], answer["error"]["param"]) == ("invalid_parameter", "path"), answer
    assert listed == []
    assert not (home / "vectors").exists() or not any((home / "vectors").iterdir())
    return str(answer["error"]["message"])


@pytest.mark.parametrize("case", sorted(FOLDERS))
def test_a_malformed_folder_import_is_a_400_naming_the_given_path_and_key(tmp_path: Path, case: str):
    write, file, key = FOLDERS[case]
    folder = write(tmp_path / "real-folder")
    (tmp_path / "given").symlink_to(folder)
    home = tmp_path / "home"
    message = refused_cleanly(home, *run_app(home, importing({"path": str(tmp_path / "given"), "name": "rainy"})))
    assert message.startswith(f"{tmp_path / 'given' / file}"), message
    assert key in message and "real-folder" not in message, message


@pytest.mark.parametrize("case", sorted(GGUFS))
def test_a_malformed_control_vector_import_is_a_400_naming_the_given_path(tmp_path: Path, case: str):
    import re

    tensors, match = GGUFS[case]
    real = gguf_file(tmp_path / "real.gguf", tensors)
    (tmp_path / "given.gguf").symlink_to(real)
    home = tmp_path / "home"
    given = str(tmp_path / "given.gguf")
    message = refused_cleanly(home, *run_app(home, importing({"path": given, "name": "rainy"})))
    assert message.startswith(f"{given}: ") and re.search(match, message) and "real.gguf" not in message, message


def test_a_symlink_loop_or_a_header_of_millions_of_values_is_a_400(tmp_path: Path):
    loop = tmp_path / "loop.gguf"
    loop.symlink_to(loop)
    junk = empty_strings_gguf(tmp_path / "junk.gguf")
    home = tmp_path / "home"
    for path, match in ((loop, "not a readable vector-set folder"), (junk, "junk.gguf: not a GGUF file")):
        message = refused_cleanly(home, *run_app(home, importing({"path": str(path), "name": "rainy"})))
        assert match in message, message


def test_a_set_of_any_finite_non_zero_norm_is_imported_at_unit_norm(tmp_path: Path):
    folder = write_folder(tmp_path / "loud", vectors=unit_rows() * 1e6)
    loud = gguf_file(tmp_path / "loud.gguf", {"direction.4": np.full(D, 1e30, dtype=np.float32)})

    async def scenario(client: Any) -> list[Any]:
        answers = []
        for body in ({"path": str(folder), "name": "loudset"}, {"path": str(loud), "name": "loudcv"}):
            r = await client.post("/api/vectors/import", json=body)
            answers.append((r.status_code, await r.get_json()))
        for name in ("loudset", "loudcv"):
            answers.append(await (await client.get(f"/api/vectors/{name}")).get_json())
        return answers

    (s1, a1), (s2, a2), card1, card2 = run_app(tmp_path / "home", scenario)
    assert (s1, s2) == (201, 201), (a1, a2)
    assert a2["data"][0]["source"]["norm"] == pytest.approx(1e30 * D ** 0.5, rel=1e-6)
    for card in (card1, card2):
        assert [v["norm"] for v in card["vectors"]] == [pytest.approx(1.0, abs=1e-5)], card


def test_a_damaged_or_removed_set_is_listed_flagged_and_deleted(tmp_path: Path):
    import torch

    from millm.sae.vector_sets import VectorSet
    from millm.steering.service import SteeringService
    from millm.store import Store
    from millm.vectors import catalog

    home = tmp_path / "home"
    svc = SteeringService(Store(home / "millm.db"))
    for name in ("vkept", "vdamaged", "vremoved"):
        catalog.store(svc, home, VectorSet((name,), torch.from_numpy(unit_rows()), 3, "fake"))
    (home / "vectors" / "vdamaged" / "vectors.safetensors").write_bytes(b"\xff" * 16)
    for file in (home / "vectors" / "vremoved").iterdir():
        file.unlink()
    (home / "vectors" / "vremoved").rmdir()

    async def scenario(client: Any) -> tuple[Any, ...]:
        before = await client.get("/api/vectors")
        deleted = [await client.delete(f"/api/vectors/{name}") for name in ("vdamaged", "vremoved")]
        after = await (await client.get("/api/vectors")).get_json()
        return before.status_code, await before.get_json(), [(d.status_code, await d.get_json()) for d in deleted], \
            after

    status, listed, deleted, after = run_app(home, scenario)
    assert status == 200, listed
    rows = {row["id"]: row for row in listed["data"]}
    assert set(rows) == {"vkept", "vdamaged", "vremoved"}
    assert rows["vkept"]["readable"] and rows["vkept"]["layer"] == 3
    assert not rows["vdamaged"]["readable"] and "vectors.safetensors" in rows["vdamaged"]["problem"]
    assert not rows["vremoved"]["readable"] and "vectors.json" in rows["vremoved"]["problem"]
    assert deleted == [(200, {"deleted": "vdamaged"}), (200, {"deleted": "vremoved"})]
    assert [row["id"] for row in after["data"]] == ["vkept"]
    assert not (home / "vectors" / "vdamaged").exists()


def test_a_folder_past_the_loaded_models_depth_is_refused_but_another_models_is_not(tmp_path: Path):
    from tests.support.malformed import good_meta

    ours = write_folder(tmp_path / "ours", {**good_meta(), "layer": LAYERS, "model": "fake"})
    theirs = write_folder(tmp_path / "theirs", {**good_meta(), "layer": LAYERS, "model": "a-deeper-model"})

    async def scenario(client: Any) -> list[Any]:
        out = []
        for path, name in ((ours, "ours"), (theirs, "theirs")):
            r = await client.post("/api/vectors/import", json={"path": str(path), "name": name})
            out.append((r.status_code, await r.get_json()))
        return out

    [(s1, a1), (s2, a2)] = run_app(tmp_path / "home", scenario)
    assert s1 == 400 and "'layer' is past the model's last layer (29)" in a1["error"]["message"], a1
    assert s2 == 201 and a2["data"][0]["layer"] == LAYERS, a2


def test_the_bodys_layer_is_a_layer(tmp_path: Path):
    one = gguf_file(tmp_path / "one.gguf", {"direction.1": np.ones(D, dtype=np.float32)})
    for layer, param in ((True, "layer"), (10**30, "layer"), (-1, "layer"), (2, "layer")):
        status, answer, listed = run_app(tmp_path / "home", importing({"path": str(one), "name": "zqx",
                                                                       "layer": layer}))
        assert (status, answer["error"]["param"], listed) == (400, param, []), (layer, answer)
    status, answer, _ = run_app(tmp_path / "home", importing({"path": str(one), "name": "zqx", "layer": 1.0}))
    assert status == 201 and answer["data"][0]["layer"] == 1, answer
