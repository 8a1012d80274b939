"""``millm batch --sae SAE --steer NAME``: a feature named alone steers the whole job at its recommended strength
(stderr and the job's last line say which number), one without a recommendation refuses the job before any line
is answered, naming the best held-out point. On the steerable scripted engine (``fake_cli``), whose steered
answers carry the norm of the row's control vector, so equal answers mean equal values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.support.batch_rows import MODEL, read_out
from tests.support.cards import measured
from tests.support.fakes import WIDTH
from tests.support.saes import random_sae, write_saelens

runner = CliRunner()
LABELS = {"5": "weather, storm, rain", "7": "ocean, sea", "9": "stormy seas"}
ROWS = [{"index": 5, "label": LABELS["5"], **measured(60.0)},
        {"index": 7, "label": LABELS["7"], **measured(40.0, rate=0.4, recommended=False)}]


@pytest.fixture
def sae(fake_cli, tmp_path) -> str:
    """An SAE of the scripted engine's width whose features.jsonl recommends 60 for feature 5 (weather) and no
    strength for feature 7 (ocean), registered and attached at its layer hint (persisted, as batch lines read)."""
    from cli.common import steering_service

    folder = write_saelens(tmp_path / "sae", random_sae(WIDTH, 16, seed=4), layer=3)
    (folder / "labels.json").write_text(json.dumps(LABELS))
    (folder / "features.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    service = steering_service()
    sid: str = service.register_sae(folder, name="batch-steer")["id"]
    service.attach(fake_cli.steering_target(), sid)
    return sid


def write_input(tmp_path: Path) -> Path:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Describe the weather."}], "temperature": 0,
            "max_tokens": 20}
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                                       "body": body}) + "\n" for i in range(2)))
    return src


def batch(src: Path, out: Path, *extra: str, code: int = 0) -> Any:
    result = runner.invoke(app, ["batch", str(src), "-o", str(out), *extra], env={"COLUMNS": "300"})
    assert result.exit_code == code, result.output
    return result


def contents(out: Path) -> list[str]:
    return [r["response"]["body"]["choices"][0]["message"]["content"] for r in read_out(out)]


def test_a_name_alone_steers_the_job_at_its_recommended_strength_and_says_which(fake_cli, sae, tmp_path):
    src = write_input(tmp_path)
    named = batch(src, tmp_path / "named.jsonl", "--sae", "batch-steer", "--steer", "weather")
    assert (f"weather: feature 5 of {sae} at its recommended strength 60 (held-out 50% [30%-69%] of 16 answers "
            "at 60 (neutral-v1))") in named.stderr
    assert f"steered with {sae} 5=60 over the live values" in named.stderr.splitlines()[-1]
    rows = read_out(tmp_path / "named.jsonl")
    assert [r["response"]["headers"]["X-miLLM-Steering"] for r in rows] == ["live", "live"]
    steered = contents(tmp_path / "named.jsonl")
    assert steered[0].startswith("Steered ") and steered[0] == steered[1]
    batch(src, tmp_path / "sixty.jsonl", "--sae", "batch-steer", "--steer", "5=60")
    batch(src, tmp_path / "thirty.jsonl", "--sae", "batch-steer", "--steer", "5=30")
    batch(src, tmp_path / "plain.jsonl")
    assert contents(tmp_path / "sixty.jsonl") == steered  # the same values: the same control vector
    assert contents(tmp_path / "thirty.jsonl") != steered
    assert not contents(tmp_path / "plain.jsonl")[0].startswith("Steered")  # the job's values were put back
    assert fake_cli.steering_target().steering.attachments[sae].values == {}


def test_a_name_without_a_recommendation_refuses_the_job_before_any_line(fake_cli, sae, tmp_path):
    src, out = write_input(tmp_path), tmp_path / "out.jsonl"
    refused = batch(src, out, "--steer", "weather", "--steer", "ocean", code=1)  # the one attached SAE
    message = " ".join(refused.stderr.split())
    assert f"'ocean' (feature 7 of {sae}) has no recommended strength" in message
    assert "held-out 40% [30%-50%] of 16 answers at 40 (neutral-v1)" in message and "ocean=STRENGTH" in message
    assert not out.exists()
    unknown = batch(src, out, "--sae", "batch-steer", "--steer", "volcano", code=1)
    assert "'volcano' matches no feature label" in " ".join(unknown.stderr.split()) and not out.exists()
    lone = batch(src, out, "--sae", "batch-steer", code=1)
    assert "--sae goes with --steer" in lone.stderr and not out.exists()


def test_an_sae_attached_to_no_model_of_the_batch_is_refused(fake_cli, sae, tmp_path):
    from cli.common import steering_service

    steering_service().detach(fake_cli.steering_target(), sae)
    src, out = write_input(tmp_path), tmp_path / "out.jsonl"
    refused = batch(src, out, "--sae", "batch-steer", "--steer", "weather", code=1)
    assert f"SAE {sae} is not attached to a model this batch names ({MODEL})" in " ".join(refused.stderr.split())
    assert not out.exists()
