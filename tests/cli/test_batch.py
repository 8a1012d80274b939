"""``millm batch`` on the scripted engine (``fake_cli``): every line answered as the server answers the same
request, and resumable. Whether rows batched together decode as they would alone is the engine's
(tests/batch/test_generate.py, on the real model)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.support.batch_rows import BROKEN, GOOD, PROFILE, read_out, weather_steering, write_input

runner = CliRunner()
VOLATILE = ("id", "created")


@pytest.fixture
def answered(fake_cli, tmp_path) -> Iterator[tuple[Path, Path]]:
    """The mixed file answered once, the weather profile steering its steered rows: (input, output)."""
    with weather_steering(fake_cli.steering_target()):
        src, out = write_input(tmp_path), tmp_path / "out.jsonl"
        result = runner.invoke(app, ["batch", str(src), "-o", str(out), "--batch-size", "4"])
        assert result.exit_code == 0, result.output
        yield src, out


def stable(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in VOLATILE}


def millm_headers(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items() if k.lower().startswith("x-millm-")}


def test_every_line_is_answered_in_input_order(answered):
    src, out = answered
    rows = read_out(out)
    lines = [line for line in src.read_text().splitlines() if line.strip()]
    assert len(rows) == len(lines) == len(GOOD) + len(BROKEN)
    assert [r["custom_id"] for r in rows] == [json.loads(line).get("custom_id") if line.startswith("{\"custom_id\": \"")
                                              and line.endswith("}") else None for line in lines]
    by_id = {r["custom_id"]: r for r in rows if r["custom_id"] is not None and r["error"] is None}
    assert set(by_id) == {c for c, _, _ in GOOD}


def test_bodies_equal_the_servers(fake_cli, answered):
    """Generation, scoring, embeddings, steered rows and refusals: status, body (but id and created) and the
    X-miLLM-* headers are those of the server on the same engine, with the same steering and store."""
    from millm.config import get_settings
    from tests.support.app import run

    _, out = answered
    rows = {r["custom_id"]: r for r in read_out(out) if r["error"] is None}
    from millm.server.app import create_app

    async def scenario(client: Any) -> tuple[list[tuple[int, Any, dict[str, str]]], Any]:
        answers = []
        for _, url, body in GOOD:
            r = await client.post(url, json=body)
            answers.append((r.status_code, await r.get_json(), millm_headers(r.headers)))
        plain = await client.post("/v1/chat/completions", json={k: v for k, v in GOOD[7][2].items() if k != "profile"})
        return answers, await plain.get_json()

    answers, plain = run(create_app(get_settings(), fake_cli), scenario)
    for (custom_id, _, _), (status, body, headers) in zip(GOOD, answers):
        response = rows[custom_id]["response"]
        assert response["status_code"] == status, custom_id
        assert stable(response["body"]) == stable(body), custom_id
        assert millm_headers(response["headers"]) == headers, custom_id
    steered = rows["steer1"]["response"]
    assert steered["headers"]["X-miLLM-Steering"] == f'"{PROFILE}"'
    assert steered["body"]["choices"][0]["message"]["content"] == "Stee"  # steered_script, 4 tokens
    assert plain["choices"][0]["message"] != steered["body"]["choices"][0]["message"]
    assert rows["steer2"]["response"]["headers"]["X-miLLM-Steering-Intensity"] == "0.5"
    assert rows["ign"]["response"]["headers"]["X-miLLM-Ignored-Fields"] == '"user"'
    assert rows["bad2"]["response"]["status_code"] == 404


def test_bad_lines_get_a_status_and_an_error_body(answered):
    _, out = answered
    broken = read_out(out)[5:5 + len(BROKEN)]
    assert [r["response"]["status_code"] for r in broken] == [400, 404, 405, 400, 400]
    for row in broken:
        assert row["error"]["code"] == row["response"]["body"]["error"]["code"]
        assert row["response"]["body"]["error"]["message"]
    assert broken[3]["error"]["message"].startswith("'custom_id' 'c1' is used by line 1")


def test_ids_come_from_the_line_not_the_clock(answered):
    src, out = answered
    rows = read_out(out)
    first = rows[0]
    assert first["id"].startswith("batch_req_") and first["response"]["request_id"].startswith("req_")
    assert first["response"]["body"]["id"] == "chatcmpl-" + first["id"].removeprefix("batch_req_")
    assert first["response"]["body"]["created"] == int(src.stat().st_mtime)
    assert len({r["id"] for r in rows}) == len(rows)


def test_resume_after_a_killed_run(answered, tmp_path):
    """A partial output whose last line is torn: the torn line is rewritten, nothing is answered twice, and
    the result is the uninterrupted run's file byte for byte."""
    src, full = answered
    whole = full.read_bytes().splitlines(keepends=True)
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"".join(whole[:7]) + whole[7][:40])
    result = runner.invoke(app, ["batch", str(src), "-o", str(out), "--batch-size", "4"])
    assert result.exit_code == 0, result.output
    assert "already done" in result.output
    assert out.read_bytes() == full.read_bytes()
    again = runner.invoke(app, ["batch", str(src), "-o", str(out)])
    assert again.exit_code == 0 and out.read_bytes() == full.read_bytes()


def test_batch_refuses_bad_options(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("")
    assert runner.invoke(app, ["batch", str(src), "-o", str(tmp_path / "o"), "--batch-size", "0"]).exit_code == 1
    result = runner.invoke(app, ["batch", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o")])
    assert result.exit_code == 1 and "missing.jsonl" in result.output
    assert runner.invoke(app, ["batch", str(src), "-o", str(src)]).exit_code == 1


def test_a_tool_call_line_answers_tool_calls_as_the_server_renders_them(fake_cli, tmp_path):
    from millm.structured.tools import call_text

    fake_cli.say(call_text("get_weather", '{"city": "Paris"}'))  # the scripted engine answers the call
    engine = fake_cli
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    body = {"model": engine.model_id, "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [weather], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "max_tokens": 200, "temperature": 0}
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps({"custom_id": "t", "method": "POST", "url": "/v1/chat/completions", "body": body}) + "\n")
    result = runner.invoke(app, ["batch", str(src), "-o", str(out)])
    assert result.exit_code == 0, result.output
    choice = read_out(out)[0]["response"]["body"]["choices"][0]
    call = choice["message"]["tool_calls"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
