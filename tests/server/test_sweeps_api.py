"""``POST /api/sweeps`` on the session's real server: every refusal is a clear 4xx before any model work with
nothing left running; a sweep runs as a job (a second one meanwhile is a 409), and its numbers are ``millm steer
sweep --json``'s for the same seed. Short sweeps: two strengths, two prompts, a few tokens."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

SAE = "smollm2-135m-res-L10"
MUSIC = 2375
SHORT = {"sae": SAE, "feature": MUSIC, "strengths": [0, 40], "prompts": 2, "held_out": 2, "tokens": 6, "seed": 3}


@pytest.fixture
def attached(server: str) -> Iterator[str]:
    """The bundled L10 SAE attached on the server for the test, detached afterwards."""
    r = httpx.post(f"{server}/api/saes/{SAE}/attach", json={})
    assert r.status_code == 200, r.text
    yield server
    httpx.post(f"{server}/api/saes/{SAE}/detach")


def nothing_running(base: str) -> bool:
    return not any(j["status"] in ("queued", "running") for j in httpx.get(base + "/api/sweeps").json()["data"])


def until_ended(base: str, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 300
    while (job := httpx.get(f"{base}/api/sweeps/{job_id}").json())["status"] in ("queued", "running"):
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    return job


@pytest.mark.parametrize(("change", "status", "param", "says"), [
    ({"strengths": [0, 300]}, 400, "strengths", "within -200..200"),
    ({"strengths": [20, 20]}, 400, "strengths", "distinct"),
    ({"strengths": []}, 400, "strengths", "1 to 32"),
    ({"strengths": ["a"]}, 400, "strengths.0", "is not of type 'number'"),
    ({"feature": 999999}, 400, "index", "outside"),
    ({"sae": "no-such-sae"}, 404, "sae", "no-such-sae"),
    ({"prompts": 0}, 400, "prompts", "prompts"),
    ({"scope": "everywhere"}, 400, "scope", "scope"),
    ({"concepts": [" "]}, 400, "concepts", "concepts"),
    ({"colour": "red"}, 400, "colour", "colour"),
])
def test_refusals_name_the_field_and_leave_nothing_running(attached, change, status, param, says):
    r = httpx.post(attached + "/api/sweeps", json={**SHORT, **change})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and says in error["message"]
    assert nothing_running(attached)


def test_an_sae_that_is_not_attached_is_refused(server):
    r = httpx.post(server + "/api/sweeps", json=SHORT)
    assert r.status_code == 400 and r.json()["error"]["param"] == "sae" and "attach it first" in r.text
    assert nothing_running(server)


def test_a_gguf_model_is_refused(gguf_server):
    r = httpx.post(gguf_server + "/api/sweeps", json=SHORT)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "model" and "llama.cpp" in r.json()["error"]["message"]
    assert nothing_running(gguf_server)


def test_a_sweep_job_equals_the_cli_for_the_same_seed_and_a_second_job_meanwhile_is_refused(attached, engine):
    from cli.main import app

    r = httpx.post(attached + "/api/sweeps", json=SHORT)
    assert r.status_code == 202, r.text
    job = r.json()
    assert r.headers["Location"] == f"/api/sweeps/{job['id']}" and job["status"] in ("queued", "running")
    second = httpx.post(attached + "/api/sweeps", json=SHORT)
    assert second.status_code == 409 and second.json()["error"]["code"] == "sweep_job_running"
    done = until_ended(attached, job["id"])
    assert done["status"] == "succeeded", done
    result = done["result"]
    assert [p["strength"] for p in result["points"]] == [0.0, 40.0]
    answers = {a["strength"]: a["answers"] for a in done["answers"]}
    assert set(answers) == {0.0, 40.0} and all(len(a) == 2 for a in answers.values())
    assert [answers[p["strength"]][0] for p in result["points"]] == [p["example"] for p in result["points"]]
    assert len(done["prompts"]) == 2 and nothing_running(attached)

    args = ["--sae", SAE, "--strengths", "0,40", "--prompts", "2", "--held-out", "2", "--tokens", "6", "--seed", "3"]
    cli = CliRunner().invoke(app, ["steer", "sweep", str(MUSIC), *args, "--json"], env={"COLUMNS": "200"})
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.stdout) == result


def test_a_jobs_held_out_rate_and_interval_are_counted_from_its_held_out_answers(attached):
    from millm.research.interval import wilson
    from millm.research.words import mentions

    words = ["the", "a", "i", "you", "to", "is", "and", "it"]  # words most answers say: a strength is chosen
    r = httpx.post(attached + "/api/sweeps", json={**SHORT, "held_out": 5, "tokens": 8, "concepts": words})
    assert r.status_code == 202, r.text
    done = until_ended(attached, r.json()["id"])
    assert done["status"] == "succeeded", done
    held = done["result"]["held_out"]
    assert held is not None and held["strength"] == 40.0 and held["answers"] == 5
    answers = {a["strength"]: a["answers"] for a in done["held_out_answers"]}[40.0]
    said = sum(1 for answer in answers if mentions(answer, words))  # counted here, from the answers the job kept
    assert len(answers) == 5 and held["rate"] == round(said / 5, 4)
    assert held["interval"] == [round(x, 4) for x in wilson(said, 5)]
    assert held["weights"] == "float32" and held["prompt_set"] == "neutral-v1"


def test_a_sweeps_record_outlives_its_server(attached, settings):
    """A sweep's record is kept in the store, as learning jobs' are: a server started on the same home (no model
    loaded) lists it and shows it as the server that ran it did, result and answers included."""
    import asyncio

    from millm.server.app import create_app

    r = httpx.post(attached + "/api/sweeps", json={**SHORT, "strengths": [0, 20]})
    assert r.status_code == 202, r.text
    done = until_ended(attached, r.json()["id"])
    assert done["status"] == "succeeded", done

    async def restarted() -> tuple[Any, Any]:
        app = create_app(settings)
        async with app.test_app():
            client = app.test_client()
            listed = await (await client.get("/api/sweeps")).get_json()
            return listed, await (await client.get(f"/api/sweeps/{done['id']}")).get_json()

    listed, again = asyncio.run(restarted())
    assert listed["data"][0]["id"] == done["id"] and again == done
    assert again["result"]["points"] and again["answers"] and again["figure"] is not None
