"""``millm batch``: every line answered as the live server answers the same request, and resumable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app
from millm.batch.generate import Job, run_generations, run_padded
from millm.engine.decode.admission import BatchSettings
from millm.engine.decode.scheduler import Scheduler
from millm.requests.builder import build_chat
from tests.support.batch_rows import BROKEN, GOOD, PROFILE, read_out, weather_profile, write_input

__all__ = ["weather_profile"]
runner = CliRunner()
VOLATILE = ("id", "created")


@pytest.fixture(scope="module")
def answered(engine, weather_profile, tmp_path_factory) -> tuple[Path, Path]:
    """The mixed file answered once: (input, output)."""
    folder = tmp_path_factory.mktemp("batch")
    src, out = write_input(folder), folder / "out.jsonl"
    result = runner.invoke(app, ["batch", str(src), "-o", str(out), "--batch-size", "4"])
    assert result.exit_code == 0, result.output
    return src, out


def stable(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in VOLATILE}


def millm_headers(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.lower().startswith("x-millm-")}


def test_every_line_is_answered_in_input_order(answered):
    src, out = answered
    rows = read_out(out)
    lines = [line for line in src.read_text().splitlines() if line.strip()]
    assert len(rows) == len(lines) == len(GOOD) + len(BROKEN)
    assert [r["custom_id"] for r in rows] == [json.loads(line).get("custom_id") if line.startswith("{\"custom_id\": \"")
                                              and line.endswith("}") else None for line in lines]
    by_id = {r["custom_id"]: r for r in rows if r["custom_id"] is not None and r["error"] is None}
    assert set(by_id) == {c for c, _, _ in GOOD}


def test_bodies_equal_the_live_servers(answered, server):
    """Greedy generation, scoring, embeddings, steered rows and refusals: status, body (but id and created)
    and the X-miLLM-* headers are the server's own."""
    _, out = answered
    rows = {r["custom_id"]: r for r in read_out(out) if r["error"] is None}
    with httpx.Client(base_url=server, timeout=300) as http:
        for custom_id, url, body in GOOD:
            live = http.post(url, json=body)
            response = rows[custom_id]["response"]
            assert response["status_code"] == live.status_code, custom_id
            assert stable(response["body"]) == stable(live.json()), custom_id
            assert {k.lower(): v for k, v in response["headers"].items()} == millm_headers(live), custom_id
        plain = http.post("/v1/chat/completions", json={k: v for k, v in GOOD[7][2].items() if k != "profile"})
    steered = rows["steer1"]["response"]
    assert steered["headers"]["X-miLLM-Steering"] == f'"{PROFILE}"'
    assert steered["body"]["choices"][0]["message"] != plain.json()["choices"][0]["message"]
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


def chat_job(engine, text: str, **fields: Any) -> Job:
    body = {"model": engine.model_id, "messages": [{"role": "user", "content": text}], "temperature": 0,
            "max_tokens": 4, **fields}
    built = build_chat(body, lambda _: "transformers")
    return Job([engine.prepare(built.generations[0])])


def test_shared_padded_runs_equal_runs_alone(engine):
    """Greedy rows with equal parameters decode as one padded plan (the path of engines without a
    scheduler), and each row's events are those of its own run."""
    texts = ["Hi.", "What is the capital of France?", "Name a fruit."]
    shared, alone = [chat_job(engine, t) for t in texts], [chat_job(engine, t) for t in texts]
    run_padded(engine, shared)
    run_generations(engine, alone, shares=False)
    assert [j.events for j in shared] == [j.events for j in alone]
    assert all(j.error is None and j.events for j in shared)


def test_scheduled_rows_with_different_parameters_equal_runs_alone(engine, settings, monkeypatch):
    """Rows with different budgets, stops and penalties share the scheduler's batch, each giving the events of
    its own run; the scheduler's fallbacks (a seed, n > 1) are the only rows it serves alone: a schema is a
    row's own matcher, batched (MILLM_BATCHING_CONSTRAINTS=refuse would serve it alone)."""
    def jobs() -> list[Job]:
        return [chat_job(engine, "Hi."), chat_job(engine, "What is the capital of France?", max_tokens=7),
                chat_job(engine, "Count to five.", stop=[","]),
                chat_job(engine, "Name a fruit.", frequency_penalty=1.5),
                chat_job(engine, "Pick a word.", temperature=1, seed=3), chat_job(engine, "Say yes.", n=2),
                chat_job(engine, "JSON.", response_format={"type": "json_object"}, max_tokens=6)]

    alone = jobs()
    run_generations(engine, alone, shares=False)
    submitted: list[bool] = []
    real_submit = Scheduler.submit

    def counted(self, job):
        submitted.append(job.alone)
        return real_submit(self, job)

    monkeypatch.setattr(Scheduler, "submit", counted)
    batched = jobs()
    run_generations(engine, batched, BatchSettings.of(settings))
    assert [j.events for j in batched] == [j.events for j in alone]
    assert all(j.error is None and j.events for j in batched)
    assert submitted == [False, False, False, False, True, True, False]


def test_batch_refuses_bad_options(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("")
    assert runner.invoke(app, ["batch", str(src), "-o", str(tmp_path / "o"), "--batch-size", "0"]).exit_code == 1
    result = runner.invoke(app, ["batch", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o")])
    assert result.exit_code == 1 and "missing.jsonl" in result.output
    assert runner.invoke(app, ["batch", str(src), "-o", str(src)]).exit_code == 1


def test_a_tool_call_line_answers_tool_calls_as_the_server_renders_them(engine, tmp_path):
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    body = {"model": engine.model_id, "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [weather], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "max_tokens": 40, "temperature": 0}
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps({"custom_id": "t", "method": "POST", "url": "/v1/chat/completions", "body": body}) + "\n")
    result = runner.invoke(app, ["batch", str(src), "-o", str(out)])
    assert result.exit_code == 0, result.output
    choice = read_out(out)[0]["response"]["body"]["choices"][0]
    call = choice["message"]["tool_calls"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert call["function"]["name"] == "get_weather" and "city" in json.loads(call["function"]["arguments"])
