"""``millm score`` end to end on the scripted engine (``fake_cli``): results, bad rows, batching, and resuming
after a killed run. What the probabilities mean is the engine's (tests/engine/test_scoring.py)."""

import json
import math
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


def test_score_file(fake_cli, tmp_path):
    """The scripted engine's tokens are characters: an allowed token is one character, and its scores are
    -1, -2, ... in the order allowed (1, 2, 3 when none is)."""
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join([
        json.dumps({"prompt": "2+2="}),
        json.dumps({"messages": [{"role": "user", "content": "Is water wet? Answer y or n."}],
                    "allowed_tokens": ["y", "n"]}),
        "{broken",
        json.dumps({"prompt": "The capital of France is", "allowed_tokens": ["P", "L"]}),
        json.dumps({"prompt": "x", "allowed_tokens": ["two tokens here"]}),
    ]) + "\n")
    out = tmp_path / "out.jsonl"
    result = runner.invoke(app, ["score", str(src), "-o", str(out), "--logprobs", "3", "--batch-size", "2"])
    assert result.exit_code == 0, result.output
    rows = lines(out)
    assert [r["row"] for r in rows] == [0, 1, 2, 3, 4]
    assert len(rows[0]["top"]) == 3
    assert [(t["token"], t["logprob"]) for t in rows[1]["top"]] == [("y", -1.0), ("n", -2.0)]
    assert rows[1]["top"][0]["prob"] == pytest.approx(math.exp(-1.0))
    assert "error" in rows[2] and "error" in rows[4] and "one" in rows[4]["error"]
    assert (rows[3]["text"], rows[3]["token_id"], rows[3]["logprob"]) == ("P", rows[3]["top"][0]["token_id"], -1.0)
    prompts = [row.prompt for request in fake_cli.scored for row in request.rows]
    assert prompts[1].messages == [{"role": "user", "content": "Is water wet? Answer y or n."}]  # scored as given
    single = tmp_path / "single.jsonl"
    runner.invoke(app, ["score", str(src), "-o", str(single), "--logprobs", "3", "--batch-size", "1"])
    for a, b in zip(lines(single), rows):
        if "top" in a:
            assert a["text"] == b["text"] and a["logprob"] == pytest.approx(b["logprob"], abs=1e-4)


def test_resume_after_kill(fake_cli, tmp_path):
    """A run killed midway (``millm score`` in a process of its own, on the scripted engine slowed to 20 ms a
    row) is resumed in this one: every row once."""
    src = tmp_path / "big.jsonl"
    src.write_text("".join(json.dumps({"prompt": f"Number {i} is"}) + "\n" for i in range(200)))
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.cli", "score", str(src), "-o", str(out),
                             "--batch-size", "4", "--logprobs", "2"], stderr=subprocess.DEVNULL,
                            env={**os.environ, "MILLM_FAKE_PACE": "0.02"})
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


def test_score_errors(fake_cli, tmp_path):
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


def test_score_row_temperature_is_checked_per_row(fake_cli, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"prompt": "2+2=", "temperature": 5}) + "\n" + json.dumps({"prompt": "1+1="}) + "\n")
    out = tmp_path / "out.jsonl"
    assert runner.invoke(app, ["score", str(src), "-o", str(out)]).exit_code == 0
    first, second = lines(out)
    assert "temperature" in first["error"] and "top" in second
