"""No data loss around the files the CLI writes: ``millm batch -o`` never empties a file that is not batch
output, refuses a folder, and splits input lines at newlines only; concurrent ``millm models add`` runs
all land in the registry (fast tier: nothing here loads a model)."""

from __future__ import annotations

import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from millm.config import Settings
from millm.errors import InvalidParameter
from millm.registry import register_path, registered

runner = CliRunner()


def line(custom_id: str, content: str = "hi") -> str:
    body = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": content}], "max_tokens": 1}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body},
                      ensure_ascii=False)


@pytest.fixture
def src(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text(line("a") + "\n" + line("b") + "\n")
    return path


@pytest.mark.parametrize("text", ["notes I keep\nsecond line\n", "just one line, no newline", "{}\n",
                                  line("a") + "\n"])  # an input line is not an output line either
def test_an_output_that_is_not_batch_output_is_refused_and_kept(src, tmp_path, text):
    from millm.batch.run import open_job

    out = tmp_path / "notes.txt"
    out.write_text(text)
    with pytest.raises(InvalidParameter) as info:
        open_job(src, out)
    assert info.value.param == "output" and "not batch output" in info.value.message
    assert out.read_text() == text
    result = runner.invoke(app, ["batch", str(src), "-o", str(out)])
    assert result.exit_code == 1 and "not batch output" in result.output and out.read_text() == text


def test_a_torn_last_output_line_is_still_cut_and_answered_again(src, tmp_path):
    from millm.batch.run import open_job

    out = tmp_path / "out.jsonl"
    whole = json.dumps({"id": "batch_req_1", "custom_id": "a", "response": {}, "error": None}) + "\n"
    out.write_text(whole + '{"id": "batch_req_2", "custom_')
    job = open_job(src, out)
    assert out.read_text() == whole and [t.custom_id for t in job.todo] == ["b"]


def test_a_folder_as_output_is_a_clear_error(src, tmp_path):
    result = runner.invoke(app, ["batch", str(src), "-o", str(tmp_path)])
    assert result.exit_code == 1 and "is a folder" in result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    result = runner.invoke(app, ["batch", str(src), "-o", str(tmp_path / "missing" / "out.jsonl")])
    assert result.exit_code == 1 and "does not exist" in result.output


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "\x1c", "\r"])
def test_input_lines_split_at_newlines_only(tmp_path, separator):
    from millm.batch.run import open_job

    src = tmp_path / "in.jsonl"
    src.write_text(line("a", f"one{separator}two") + "\n" + line("b") + "\n", newline="")
    job = open_job(src, tmp_path / "out.jsonl")
    assert [x.custom_id for x in job.lines] == ["a", "b"] and all(x.refusal is None for x in job.lines)
    assert job.lines[0].body["messages"][0]["content"] == f"one{separator}two"


def _add_models(home: str, worker: int) -> None:
    settings = Settings(home=Path(home))
    for k in range(4):
        folder = Path(home) / "ckpts" / f"m{worker}-{k}"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        register_path(folder, settings)


def test_concurrent_registrations_all_land(tmp_path):
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(8, mp_context=context) as pool:
        for done in [pool.submit(_add_models, str(tmp_path), w) for w in range(8)]:
            done.result()
    ids = sorted(e.id for e in registered(Settings(home=tmp_path)))
    assert ids == sorted(f"m{w}-{k}" for w in range(8) for k in range(4))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".models-")]  # no temporary file left
