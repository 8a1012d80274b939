"""What steered each ``millm chat`` answer (one stderr line), labels on ``steer set`` / ``profiles create``, and
``chat --sae`` taking its layer over whatever is attached or active for that chat only. On the steerable scripted
engine (``fake_cli``: the bundled model's shape) with the bundled SAEs (``smollm2-135m-res-L10``: feature 2375 is
"music, melody")."""

import json

from typer.testing import CliRunner

from cli.common import steering_service
from cli.main import app

runner = CliRunner()
L10, L20 = "smollm2-135m-res-L10", "smollm2-135m-res-L20"
MUSIC = '2375 "music, melody" = 40'


def run(*args, ok=True, input=None):
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"}, input=input)
    if ok:
        assert result.exit_code == 0, result.output
    return result


def chat(*extra, ok=True, tokens=2):
    return run("chat", "Hi.", "--temperature", "0", "--max-tokens", tokens, *extra, ok=ok)


def steered(result) -> bool:
    """Whether the scripted engine's answer was steered (``steered_script``: it starts with "Steered")."""
    return result.stdout.startswith("St")


def lines(result):
    """The steering lines on stderr (stdout is the answer alone)."""
    assert "steering:" not in result.stdout
    return [line for line in result.stderr.splitlines() if line.startswith("steering:")]


def test_each_answer_says_what_steered_it(fake_cli):
    plain = chat()
    assert lines(plain) == ["steering: none (no SAE attached)"] and not steered(plain)
    own = chat("--sae", L10, "--steer", "music=40")
    assert lines(own) == [f"steering: this chat's values on {L10} (L10): {MUSIC}"] and steered(own)
    run("profiles", "create", "cli26-music", "2375=40", "--sae", L10)
    assert lines(chat("--profile", "cli26-music")) == [
        f'steering: none (profile "cli26-music" names SAE {L10}, which is not attached)']
    run("sae", "attach", L10)
    run("profiles", "activate", "cli26-music")
    full = chat(tokens=40)
    assert lines(full) == [f'steering: profile "cli26-music" on {L10} (L10): {MUSIC}']
    half = chat("--intensity", "0.5", tokens=40)
    assert lines(half) == [
        f'steering: profile "cli26-music" at intensity 0.5 on {L10} (L10): 2375 "music, melody" = 20']
    assert steered(full) and steered(half) and full.stdout != half.stdout  # half the strength, half the norm
    off = chat("--intensity", "off")
    assert lines(off) == ["steering: none (intensity off)"] and not steered(off)
    talk = run("chat", "-i", "--temperature", "0", "--max-tokens", "2", input="Hi.\nHello.\n/exit\n")
    assert lines(talk) == [f'steering: profile "cli26-music" on {L10} (L10): {MUSIC}'] * 2


def test_steer_set_and_profiles_create_take_labels(fake_cli):
    nowhere = run("steer", "set", "music=40", ok=False)
    assert nowhere.exit_code == 1 and "give --sae" in nowhere.stderr
    run("sae", "attach", L10)
    shown = json.loads(run("steer", "set", "music=40").stdout)
    assert shown["saes"][L10]["values"] == {"2375": 40.0}
    ambiguous = run("steer", "set", "weather=40", ok=False)
    assert ambiguous.exit_code == 1 and "ambiguous" in ambiguous.stderr and "1604 (weather" in ambiguous.stderr
    assert fake_cli.steering.attachments[L10].values == {2375: 40.0}
    run("profiles", "create", "cli26-music", "music=40", "--sae", L10)
    assert json.loads(run("profiles", "show", "cli26-music").stdout)["entries"] == [
        {"sae": L10, "feature": 2375, "strength": 40.0}]
    refused = run("profiles", "create", "cli26-far", "weather=40", "--sae", L10, ok=False)
    assert refused.exit_code == 1 and "ambiguous" in refused.stderr
    assert steering_service().store.profile("cli26-far") is None


def test_a_feature_named_alone_takes_its_recommended_strength_says_which_or_is_refused(fake_cli):
    from millm.sae.bundled import BUNDLED_DIR
    from millm.sae.cards import held_out_measures

    held = held_out_measures(BUNDLED_DIR / L10)  # the shipped, re-measured figures
    said = f"music: feature 2375 of {L10} at its recommended strength 40 ({held[2375].describe()})"
    own = chat("--sae", L10, "--steer", "music")
    assert said in own.stderr and lines(own) == [f"steering: this chat's values on {L10} (L10): {MUSIC}"]
    assert steered(own)
    run("sae", "attach", L10)
    shown = run("steer", "set", "music")
    assert said in shown.stderr and json.loads(shown.stdout)["saes"][L10]["values"] == {"2375": 40.0}
    created = run("profiles", "create", "cli53-music", "music", "--sae", L10)
    assert said in created.stderr
    assert json.loads(run("profiles", "show", "cli53-music").stdout)["entries"] == [
        {"sae": L10, "feature": 2375, "strength": 40.0}]
    # 990 (weather) was measured and earned no strength: refused, the best held-out point shown, nothing changed
    best = f"has no recommended strength: the best held-out point misses the 60% target ({held[990].describe()})"
    refusals = (run("steer", "set", "990", ok=False), chat("--sae", L10, "--steer", "990", ok=False),
                run("profiles", "create", "cli53-none", "990", "--sae", L10, ok=False))
    for refused in refusals:
        assert refused.exit_code == 1 and best in " ".join(refused.stderr.split()), refused.stderr
    assert fake_cli.steering.attachments[L10].values == {2375: 40.0}
    assert steering_service().store.profile("cli53-none") is None


def test_chat_sae_overrides_for_that_chat_only(fake_cli):
    service = steering_service()
    run("profiles", "create", "cli26-music", "2375=40", "--sae", L10)
    run("sae", "attach", L10)
    run("profiles", "activate", "cli26-music")
    before, stored = fake_cli.steering.snapshot(), service.store.get_state(f"steering:{fake_cli.model_id}")
    # L20 on layer 10, where L10 and the active profile are: L10 is set aside for this chat
    taken = chat("--sae", L20, "--layer", 10, "--steer", "5=40")
    assert lines(taken) == [f'steering: this chat\'s values on {L20} (L10): 5 "value, child, item" = 40; '
                            f"{L10} set aside for this chat"]
    dialled = chat("--sae", L20, "--layer", 10, "--intensity", "0.5")  # the active profile's SAE is set aside
    assert lines(dialled) == [f'steering: none (profile "cli26-music" names SAE {L10}, which is not attached; '
                              f"{L10} set aside for this chat)"]
    # L10 moved to layer 12 for one chat
    assert lines(chat("--sae", L10, "--layer", 12)) == [f'steering: profile "cli26-music" on {L10} (L12): {MUSIC}']
    # a profile on an SAE this chat does not have steers nothing (said why) rather than refusing the chat
    run("profiles", "create", "cli26-far", "5=40", "--sae", L20)
    far = chat("--sae", L10, "--profile", "cli26-far")
    assert lines(far) == [f'steering: none (profile "cli26-far" names SAE {L20}, which is not attached)']
    refused = chat("--profile", "cli26-far", ok=False)  # without --sae it is refused, as the server does
    assert refused.exit_code == 1 and L20 in refused.stderr
    assert fake_cli.steering.snapshot() == before
    assert service.store.get_state(f"steering:{fake_cli.model_id}") == stored
    assert lines(chat()) == [f'steering: profile "cli26-music" on {L10} (L10): {MUSIC}']
    run("sae", "attach", L10, "--layer", 12)  # --sae without --layer leaves an attached SAE where it is
    assert lines(chat("--sae", L10)) == [f'steering: profile "cli26-music" on {L10} (L12): {MUSIC}']


def test_scope_says_where_steering_applied_and_a_bad_one_is_refused_before_loading(fake_cli):
    steered = chat("--sae", L10, "--steer", "music=40", "--scope", "generated")
    assert lines(steered) == [f"steering: this chat's values (generated positions only) on {L10} (L10): {MUSIC}"]
    bad = chat("--scope", "decode", ok=False)
    assert bad.exit_code != 0 and "steering_scope" in bad.output and "Traceback" not in bad.output
