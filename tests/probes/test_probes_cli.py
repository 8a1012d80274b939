"""``millm probes`` on the real model: learn from files, list, show (its histogram a PNG), export, import under
another name (a batch line asking for it gets its verdict), rm; and the refusals of bad options before any model
work."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner, Result

from cli.main import app
from millm.registry import BUNDLED_ID
from tests.probes.texts import NEGATIVE, POSITIVE

runner = CliRunner()


def run(*args: object, ok: bool = True) -> Result:
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    assert (result.exit_code == 0) == ok, result.output
    return result


def test_learn_list_show_export_import_rm(engine, tmp_path: Path):
    pos, neg = tmp_path / "pos.txt", tmp_path / "neg.txt"
    pos.write_text("\n".join(POSITIVE))
    neg.write_text("\n".join(NEGATIVE))
    learned = run("probes", "learn", "rain-cli", "--positive", pos, "--negative", neg, "--layer", 12)
    assert "held-out AUROC" in learned.stdout and "on 4 + 4 held-out examples" in learned.stdout
    [listed] = [p for p in json.loads(run("probes", "list", "--json").stdout) if p["name"] == "rain-cli"]
    assert listed["layer"] == 12 and listed["model"]["hidden_size"] == 576 and listed["attached"] is None
    png = tmp_path / "hist.png"
    assert "threshold" in run("probes", "show", "rain-cli", "--out", png).stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = tmp_path / "probe.json"
    run("probes", "export", "rain-cli", doc)
    run("probes", "import", doc, "--name", "rain-copy")
    [copy] = [p for p in json.loads(run("probes", "list", "--json").stdout) if p["name"] == "rain-copy"]
    assert copy["threshold"] == listed["threshold"] and json.loads(doc.read_text())["weight"]
    lines = tmp_path / "in.jsonl"
    lines.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": BUNDLED_ID, "messages": [{"role": "user", "content": "Write about rain."}], "max_tokens": 4,
        "temperature": 0, "probes": ["rain-copy"]}}) + "\n")
    run("batch", lines, "-o", tmp_path / "out.jsonl")
    [answered] = [json.loads(t) for t in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [v["probe"] for v in answered["response"]["body"]["millm"]["probes"]] == ["rain-copy"]
    run("probes", "rm", "rain-copy")
    run("probes", "rm", "rain-cli")
    assert not [p for p in json.loads(run("probes", "list", "--json").stdout) if p["name"].startswith("rain-c")]


def test_bad_options_are_refused_before_any_model_work(tmp_path: Path):
    for args, named in ((("--method", "svm"), "'method'"), (("--aggregation", "median"), "'aggregation'"),
                        (("--target-fpr", "1"), "'target_fpr'")):
        result = run("probes", "learn", "rain-bad", "--concept", "rain", *args, ok=False)
        assert named in result.output
