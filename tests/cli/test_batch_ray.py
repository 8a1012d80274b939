"""``--ray`` on ``millm batch`` and ``millm score``: a local Ray instance (2 CPUs) writes the file a single
process writes, byte for byte, and resumes the same way."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.support.batch_rows import weather_profile, write_input

__all__ = ["weather_profile"]
ray = pytest.importorskip("ray")
runner = CliRunner()


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A local Ray instance with 2 CPUs for this module; shut down after it."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def single(engine, weather_profile, tmp_path_factory) -> tuple[Path, Path]:
    """The mixed file (generation, scoring, embeddings, steered rows, bad lines) answered on this process."""
    folder = tmp_path_factory.mktemp("batch-ray")
    src, out = write_input(folder), folder / "single.jsonl"
    result = runner.invoke(app, ["batch", str(src), "-o", str(out), "--batch-size", "4"])
    assert result.exit_code == 0, result.output
    return src, out


def test_ray_writes_the_single_process_file(single, local_ray, tmp_path):
    src, expected = single
    out = tmp_path / "ray.jsonl"
    result = runner.invoke(app, ["batch", str(src), "-o", str(out), "--batch-size", "4", "--ray", "local",
                                 "--workers", "2"])
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == expected.read_bytes()


def test_ray_resumes_a_killed_run(single, local_ray, tmp_path):
    src, expected = single
    whole = expected.read_bytes().splitlines(keepends=True)
    out = tmp_path / "ray.jsonl"
    out.write_bytes(b"".join(whole[:9]) + whole[9][:25])
    result = runner.invoke(app, ["batch", str(src), "-o", str(out), "--batch-size", "4", "--ray", "local"])
    assert result.exit_code == 0, result.output
    assert "9 already done" in result.output
    assert out.read_bytes() == expected.read_bytes()


def test_steer_on_ray_writes_the_single_process_file(engine, weather_profile, local_ray, tmp_path):
    """``--steer`` travels to every worker: the Ray file is the single-process file under the same values, which
    steer (the answers differ from the job without them), and the driver's live values are put back after."""
    from tests.support.batch_rows import SAE, chat

    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"custom_id": f"w{i}", "method": "POST", "url": "/v1/chat/completions",
                                       "body": chat(text)}) + "\n" for i, text in enumerate(["Hi.", "The sky"])))
    steer = ["--sae", SAE, "--steer", "1604=60", "--batch-size", "2"]
    outs = {name: tmp_path / f"{name}.jsonl" for name in ("plain", "single", "ray")}
    for name, extra in (("plain", ["--batch-size", "2"]), ("single", steer), ("ray", [*steer, "--ray", "local"])):
        result = runner.invoke(app, ["batch", str(src), "-o", str(outs[name]), *extra])
        assert result.exit_code == 0, result.output
    assert outs["ray"].read_bytes() == outs["single"].read_bytes()
    answers = {name: [row["response"]["body"]["choices"][0]["message"]["content"]
                      for row in map(json.loads, out.read_text().splitlines())] for name, out in outs.items()}
    assert answers["single"] != answers["plain"]
    assert engine.steering_target().steering.attachments[SAE].values == {}


def test_score_on_ray_writes_the_single_process_file(engine, local_ray, tmp_path):
    src = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "The sky is"}, {"messages": [{"role": "user", "content": "Yes or no?"}]}, "not an object",
            {"prompt": "Water is", "allowed_tokens": [" wet", " dry"]}, {"prompt": "One, two,"}]
    src.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    single, distributed = tmp_path / "single.jsonl", tmp_path / "ray.jsonl"
    assert runner.invoke(app, ["score", str(src), "-o", str(single), "--batch-size", "2"]).exit_code == 0
    # resumed after the first batch: padded scoring batches then hold the rows a single run put together
    distributed.write_text("".join(single.read_text().splitlines(keepends=True)[:2]))
    result = runner.invoke(app, ["score", str(src), "-o", str(distributed), "--batch-size", "2", "--ray", "local"])
    assert result.exit_code == 0, result.output
    assert distributed.read_bytes() == single.read_bytes()


def test_ray_without_ray_says_how_to_install(monkeypatch, tmp_path):
    import builtins

    from millm.batch.distributed import INSTALL_HINT, require_ray
    from millm.errors import InvalidParameter

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(InvalidParameter, match=r"pip install -e \.\[ray\]"):
        require_ray()
    assert "pip install -e .[ray]" in INSTALL_HINT


class ProbeWorker:
    """A stand-in for BatchWorker: each row's ``out`` names the actor's process and its niceness."""

    def __init__(self, threads: list) -> None:
        import os

        self.tag = f"{os.getpid()} {os.getpriority(os.PRIO_PROCESS, 0)}"

    def __call__(self, batch: dict) -> dict:
        import time

        import numpy as np

        time.sleep(0.2)  # a batch takes time, as a model's does: an actor that answers at once could take them all

        return {"out": np.array([f"{i} {self.tag}" for i in batch["index"]], dtype=object),
                "tokens": np.zeros(len(batch["index"]), dtype=np.int64)}


def test_actors_share_the_rows_at_the_drivers_niceness(local_ray):
    import os

    from millm.batch.distributed import run_rows

    written: list[str] = []
    run_rows([(i, f"row {i}") for i in range(16)], ProbeWorker, {}, None, 2, 1, written.append)
    assert [int(line.split()[0]) for line in written] == list(range(16))
    assert len({line.split()[1] for line in written}) == 2  # both actors answered rows (one block per batch)
    assert {line.split()[2] for line in written} == {str(os.getpriority(os.PRIO_PROCESS, 0))}  # not Ray's 15
