"""``millm clusters``, ``millm circuits`` and ``millm chat --intensity``: a round trip on the steerable scripted
engine (``fake_cli``): a steered answer is ``steered_script`` (the norm of its steering in the text)."""

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.support.saes import random_sae, write_saelens

runner = CliRunner()
MODEL = "SmolLM2-135M-Instruct"


def run(*args, ok=True):
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    if ok:
        assert result.exit_code == 0, result.output
    return result


def answer(*extra):
    return run("chat", "Write one sentence about the weather.", "--temperature", "0", "--max-tokens", "6",
               *extra).stdout


@pytest.fixture
def saes(fake_cli, tmp_path):
    """SAEs at layers 11 and 21, registered and attached through the CLI."""
    ids = {}
    for layer, seed in ((11, 31), (21, 32)):
        folder = write_saelens(tmp_path / "cli-docs" / f"l{layer}", random_sae(576, 128, seed=seed), layer=layer)
        ids[layer] = run("sae", "add", folder).stdout.split()[0]
        run("sae", "attach", ids[layer])
    return ids


def write(tmp_path, doc):
    path = tmp_path / f"{doc['name']}.json"
    path.write_text(json.dumps(doc))
    return path


CLUSTER = {"kind": "cluster", "name": "cli-cluster", "model": MODEL, "sae": {"layer": 11, "d_sae": 128},
           "members": [{"feature": f, "strength": 80.0} for f in (1, 2, 3)], "intensity_range": [0.5, 1.5]}
CIRCUIT = {"kind": "circuit", "name": "cli-circuit", "model": MODEL, "fallback_cluster": "cli-cluster",
           "members": [{"layer": 11, "feature": 4, "strength": 80.0}, {"layer": 21, "feature": 5, "strength": 80.0}],
           "evidence": {"rung": 3}}


def test_clusters_round_trip(fake_cli, saes, tmp_path):
    path = write(tmp_path, CLUSTER)
    assert "imported cluster cli-cluster (3 members)" in run("clusters", "import", path).stdout
    again = run("clusters", "import", path, ok=False)
    assert again.exit_code == 1 and "overwrite" in again.stderr
    run("clusters", "import", path, "--overwrite")
    listed = run("clusters", "list").stdout
    assert "cli-cluster" in listed and "[0.5, 1.5]" in listed
    bad = write(tmp_path, {**CLUSTER, "name": "cli-bad", "members": [{"feature": 200, "strength": 1.0}]})
    refused = run("clusters", "import", bad, ok=False)
    assert refused.exit_code == 1 and "/members/0/feature" in refused.stderr
    assert "cli-bad" not in run("profiles", "list").stdout

    plain = answer()
    assert answer("--profile", "cli-cluster", "--intensity", "off") == plain
    at_max = answer("--profile", "cli-cluster", "--intensity", "max")
    assert at_max != plain
    assert answer("--profile", "cli-cluster", "--intensity", "2") == at_max  # capped at the range's maximum
    wrong = run("chat", "hi", "--intensity", "loud", ok=False)
    assert wrong.exit_code == 1 and "steering_intensity" in wrong.stderr

    assert "dial 0" in run("clusters", "dial", "cli-cluster", "0").stdout
    assert json.loads(run("clusters", "show", "cli-cluster").stdout)["intensity"] == 0.0
    assert answer("--profile", "cli-cluster") == plain  # the stored dial
    assert answer("--profile", "cli-cluster", "--intensity", "1.5") == at_max  # the chat's own dial
    over = run("clusters", "dial", "cli-cluster", "1.6", ok=False)
    assert over.exit_code == 1 and "from 0 to 1.5" in over.stderr
    run("clusters", "dial", "cli-cluster", "1.5")
    run("profiles", "activate", "cli-cluster")
    assert answer() == at_max and answer("--intensity", "0") == plain  # dialling the active profile
    assert "re-applied" in run("clusters", "dial", "cli-cluster", "0").stdout
    assert answer() == plain  # the active cluster follows its dial
    run("steer", "clear")


def test_circuits_round_trip(fake_cli, saes, tmp_path):
    run("clusters", "import", write(tmp_path, CLUSTER), "--overwrite")
    run("circuits", "import", write(tmp_path, CIRCUIT), "--overwrite")
    assert "native" in run("circuits", "list").stdout
    shown = json.loads(run("circuits", "show", "cli-circuit").stdout)
    assert shown["steering"]["rung"] == 3 and shown["steering"]["language"] == "faithfulness-tested (circuit)"
    activated = run("circuits", "activate", "cli-circuit").stdout
    assert "native, rung 3 (faithfulness-tested (circuit))" in activated
    active = json.loads(run("circuits", "active").stdout)
    assert active["active"] == "cli-circuit" and active["steering"]["mode"] == "native"
    plain_after = answer("--intensity", "off")
    assert answer() != plain_after
    run("sae", "detach", saes[21])
    assert json.loads(run("circuits", "active").stdout)["steering"]["mode"] == "slice_fallback"
    run("sae", "attach", saes[21])
    run("steer", "clear")
    assert json.loads(run("circuits", "active").stdout)["active"] is None
    assert "deleted circuit cli-circuit" in run("circuits", "rm", "cli-circuit").stdout
    assert run("circuits", "show", "cli-circuit", ok=False).exit_code == 1
    assert "deleted cluster cli-cluster" in run("clusters", "rm", "cli-cluster").stdout
    assert "cli-cluster" not in run("profiles", "list").stdout
