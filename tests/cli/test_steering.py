"""``millm sae``, ``millm steer``, ``millm profiles`` and ``millm chat`` steering flags, on the steerable scripted
engine (``fake_cli``): a steered answer is ``steered_script`` (the norm of its steering in the text)."""

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.support.saes import random_sae, write_saelens

runner = CliRunner()


def run(*args, ok=True):
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    if ok:
        assert result.exit_code == 0, result.output
    return result


@pytest.fixture
def sae_id(fake_cli, tmp_path):
    folder = write_saelens(tmp_path / "cli-sae" / "l12", random_sae(576, 512, seed=11), layer=12)
    result = run("sae", "add", folder, "--name", "cli-test")
    sid = result.stdout.split()[0]
    assert sid.startswith("sae_") and "saelens" in result.stdout and "layer_hint=12" in result.stdout
    return sid


def answer(*extra):
    return run("chat", "Write one sentence about the weather.", "--temperature", "0", "--max-tokens", "12",
               *extra).stdout


def test_sae_list_attach_steer_detach(fake_cli, sae_id):
    plain = answer()
    run("sae", "attach", sae_id)
    assert fake_cli.steering.attachments[sae_id].layer == 12
    assert f"{sae_id}" in run("sae", "list").stdout and " 12 " in run("sae", "list").stdout
    shown = json.loads(run("steer", "set", "5=150").stdout)
    assert shown["saes"][sae_id]["values"] == {"5": 150.0}
    steered = answer()
    assert steered != plain
    run("steer", "set", "5=0")
    assert answer() == plain
    assert json.loads(run("steer", "show").stdout)["saes"][sae_id]["values"] == {}
    run("sae", "detach", sae_id)
    assert sae_id not in fake_cli.steering.attachments


def test_chat_flags_steer_for_one_chat_only(fake_cli, sae_id):
    plain = answer()
    steered = answer("--sae", sae_id, "--steer", "5=150")
    assert steered != plain
    assert sae_id not in fake_cli.steering.attachments  # attached for that chat only
    assert answer() == plain


def test_profiles_commands(fake_cli, sae_id, tmp_path):
    run("profiles", "create", "cli-weather", "5=150", "--sae", sae_id, "--description", "test")
    assert "cli-weather" in run("profiles", "list").stdout
    doc = json.loads(run("profiles", "show", "cli-weather").stdout)
    assert doc["entries"] == [{"sae": sae_id, "feature": 5, "strength": 150.0}]
    run("profiles", "export", "cli-weather", "-o", tmp_path / "p.json")
    dup = run("profiles", "import", tmp_path / "p.json", ok=False)
    assert dup.exit_code == 1 and "exists" in dup.stderr
    run("profiles", "import", tmp_path / "p.json", "--overwrite")
    plain = answer()
    via_profile = answer("--sae", sae_id, "--profile", "cli-weather")
    assert via_profile == answer("--sae", sae_id, "--steer", "5=150") != plain
    run("sae", "attach", sae_id)
    try:
        run("profiles", "activate", "cli-weather")
        assert fake_cli.steering.active_profile == "cli-weather" and answer() == via_profile
    finally:
        run("steer", "clear")
        run("sae", "detach", sae_id)


def test_cli_steering_errors(sae_id):
    cases = [(("sae", "add", "/no/such/sae"), "no such file"),
             (("sae", "attach", "sae_unknown"), "sae_unknown"),
             (("steer", "set", "5:3"), "FEATURE=STRENGTH"),
             (("chat", "hi", "--steer", "1=2"), "--steer needs --sae"),
             (("chat", "hi", "--profile", "nope"), "nope"),
             (("profiles", "show", "nope"), "nope")]
    for args, needle in cases:
        result = run(*args, ok=False)
        assert result.exit_code == 1 and needle in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.output
