"""``millm score`` end to end: results, bad rows, batching, and resuming after a killed run."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_score_file(engine, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join([
        json.dumps({"prompt": "2+2="}),
        json.dumps({"messages": [{"role": "user", "content": "Is water wet? Answer yes or no."}],
                    "allowed_tokens": ["yes", "no"]}),
        "{broken",
        json.dumps({"prompt": "The capital of France is", "allowed_tokens": [" Paris", " London"]}),
        json.dumps({"prompt": "x", "allowed_tokens": ["two tokens here"]}),
    ]) + "\n")
    out = tmp_path / "out.jsonl"
    result = runner.invoke(app, ["score", str(src), "-o", str(out), "--logprobs", "3", "--batch-size", "2"])
    assert result.exit_code == 0, result.output
    rows = lines(out)
    assert [r["row"] for r in rows] == [0, 1, 2, 3, 4]
    assert len(rows[0]["top"]) == 3
    assert {t["token"] for t in rows[1]["top"]} == {"yes", "no"}
    assert sum(t["prob"] for t in rows[1]["top"]) == pytest.approx(1.0)
    assert "error" in rows[2] and "error" in rows[4] and "one" in rows[4]["error"]
    assert rows[3]["text"] == " Paris"
    single = tmp_path / "single.jsonl"
    runner.invoke(app, ["score", str(src), "-o", str(single), "--logprobs", "3", "--batch-size", "1"])
    for a, b in zip(lines(single), rows):
        if "top" in a:
            assert a["text"] == b["text"] and a["logprob"] == pytest.approx(b["logprob"], abs=1e-4)


def test_resume_after_kill(engine, tmp_path):
    src = tmp_path / "big.jsonl"
    src.write_text("".join(json.dumps({"prompt": f"Number {i} is"}) + "\n" for i in range(200)))
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "cli", "score", str(src), "-o", str(out), "--batch-size", "4",
                             "--logprobs", "2"], stderr=subprocess.DEVNULL, env=dict(os.environ))
    deadline = time.monotonic() + 120
    while not out.exists() or len(out.read_text().splitlines()) < 12:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = len(out.read_text().splitlines())
    assert 12 <= partial < 200
    result = runner.invoke(app, ["score", str(src), "-o", str(out), "--batch-size", "16", "--logprobs", "2"])
    assert result.exit_code == 0, result.output
    rows = lines(out)
    assert sorted(r["row"] for r in rows) == list(range(200))
    assert "already done" in result.stderr
    fresh = tmp_path / "fresh.jsonl"
    runner.invoke(app, ["score", str(src), "-o", str(fresh), "--batch-size", "16", "--logprobs", "2"])
    by_row = {r["row"]: r for r in rows}
    for r in lines(fresh)[:20]:
        assert by_row[r["row"]]["text"] == r["text"]


def test_score_errors(engine, tmp_path):
    result = runner.invoke(app, ["score", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o.jsonl")])
    assert result.exit_code == 1 and "missing.jsonl" in result.stderr
    result = runner.invoke(app, ["score", str(tmp_path / "x"), "-o", str(tmp_path / "o"), "--logprobs", "30"])
    assert result.exit_code == 1 and "logprobs" in result.stderr


@pytest.mark.parametrize("temperature", ["5", "-1", "0.0005"])
def test_score_options_obey_the_servers_rules(tmp_path, temperature):
    """The CLI builds scoring rows with the server's rules: a temperature the server refuses is refused here,
    before anything is loaded or written."""
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"prompt": "2+2="}) + "\n")
    out = tmp_path / "out.jsonl"
    result = runner.invoke(app, ["score", str(src), "-o", str(out), "--temperature", temperature])
    assert result.exit_code == 1
    assert "temperature" in result.output and not out.exists()


def test_score_row_temperature_is_checked_per_row(engine, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"prompt": "2+2=", "temperature": 5}) + "\n" + json.dumps({"prompt": "1+1="}) + "\n")
    out = tmp_path / "out.jsonl"
    assert runner.invoke(app, ["score", str(src), "-o", str(out)]).exit_code == 0
    first, second = lines(out)
    assert "temperature" in first["error"] and "top" in second
