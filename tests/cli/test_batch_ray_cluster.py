"""``millm batch --ray auto`` (and ``millm score --ray auto``) on a machine in no Ray cluster: one clear line
and exit 1, never Ray's ConnectionError traceback, decided before any model loads (issue 36). Fast tier: no
model, no cluster."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()
LINE = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}}


ROWS = {"batch": LINE, "score": {"prompt": "The sky is"}}


def on_ray_auto(tmp_path: Path, command: str = "batch") -> tuple[object, Path]:
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps(ROWS[command]) + "\n")
    return runner.invoke(app, [command, str(src), "-o", str(out), "--ray", "auto"]), out


def assert_one_clear_line(result, out: Path) -> None:
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output and "ConnectionError" not in result.output, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "No Ray cluster was found at auto" in lines[0] and "ray start --head" in lines[0], lines[0]
    assert "--ray local" in lines[0], lines[0]
    assert not out.exists() or out.read_text() == ""  # nothing answered


@pytest.mark.parametrize("command", ["batch", "score"])
def test_ray_auto_without_a_cluster_is_one_line_and_exit_1(tmp_path, monkeypatch, command):
    """The real ``ray.init(address="auto")``: it finds no cluster here and raises ConnectionError."""
    ray = pytest.importorskip("ray")
    from ray._private import services

    import millm.engine

    assert not ray.is_initialized()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # "auto" also joins any Ray instance another process on this machine runs (another test session's local
    # one): this test is about a machine in no cluster, so Ray's discovery sees none
    def no_gcs() -> list[str]:
        return []

    no_gcs.cache_clear = lambda: None  # type: ignore[attr-defined]  # as Ray's own, which ray.init clears
    monkeypatch.setattr(services, "find_gcs_addresses", no_gcs)
    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: None)
    monkeypatch.setattr(millm.engine, "load_engine", lambda *a, **k: pytest.fail("a model was loaded"))
    result, out = on_ray_auto(tmp_path, command)
    assert_one_clear_line(result, out)
    assert not ray.is_initialized()


def test_ray_init_connection_error_is_one_line_wherever_ray_comes_from(tmp_path, monkeypatch):
    """The same with a stand-in ``ray`` whose init raises ConnectionError (runs where Ray is not installed too)."""
    calls: list[object] = []

    def init(address=None, **kwargs):
        calls.append(address)
        raise ConnectionError("Could not find any running Ray instance.")

    fake = types.ModuleType("ray")
    fake.init = init  # type: ignore[attr-defined]
    fake.is_initialized = lambda: False  # type: ignore[attr-defined]
    fake.data = types.ModuleType("ray.data")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setitem(sys.modules, "ray.data", fake.data)  # type: ignore[attr-defined]
    result, out = on_ray_auto(tmp_path)
    assert_one_clear_line(result, out)
    assert calls == ["auto"]
