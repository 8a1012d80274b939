"""The ``millm`` CLI through Typer's runner, on the scripted engine (``fake_cli``): what each command sends
the engine and prints of its answer."""

import json

from typer.testing import CliRunner

from cli.main import app
from tests.support.fakes import SCRIPT

runner = CliRunner()


def asked(engine, request: int = -1) -> list[dict]:
    """The messages of a request the engine was asked (the last by default)."""
    return list(engine.requests[request].prompts[0].messages)


def test_chat_answers(fake_cli):
    result = runner.invoke(app, ["chat", "What is the capital of France?", "--temperature", "0", "--max-tokens", "20",
                                 "--system", "Be brief."])
    assert result.exit_code == 0, result.output
    assert result.stdout == SCRIPT[:20] + "\n"
    assert asked(fake_cli) == [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "What is the capital of France?"}]
    params = fake_cli.requests[-1].params
    assert (params.temperature, params.max_tokens) == (0.0, 20)
    assert "stopped at max_tokens" in result.stderr


def test_chat_stop_and_seed(fake_cli):
    args = ["chat", "Name a fruit.", "--temperature", "1", "--seed", "4", "--max-tokens", "12"]
    a, b = runner.invoke(app, args), runner.invoke(app, args)
    assert a.exit_code == 0 and a.stdout == b.stdout
    assert fake_cli.requests[-1].params.seed == 4
    cut = runner.invoke(app, ["chat", "What is the capital of France?", "--temperature", "0", "--stop", "fake"])
    assert cut.exit_code == 0 and cut.stdout == SCRIPT[:SCRIPT.index("fake")] + "\n"


def test_chat_reads_piped_stdin(fake_cli):
    result = runner.invoke(app, ["chat", "--temperature", "0", "--max-tokens", "20"],
                           input="What is the capital of France?")
    assert result.exit_code == 0 and result.stdout == SCRIPT[:20] + "\n"
    assert asked(fake_cli) == [{"role": "user", "content": "What is the capital of France?"}]


def test_interactive_chat_keeps_history_and_resets(fake_cli):
    result = runner.invoke(app, ["chat", "-i", "--temperature", "0", "--max-tokens", "12",
                                 "--system", "Answer in one short sentence."],
                           input="My name is Zed.\nWhat is my name?\n/reset\nAgain.\n/exit\nnever asked\n")
    assert result.exit_code == 0, result.output
    system = {"role": "system", "content": "Answer in one short sentence."}
    answer = {"role": "assistant", "content": SCRIPT[:12]}
    assert [asked(fake_cli, i) for i in range(len(fake_cli.requests))] == [
        [system, {"role": "user", "content": "My name is Zed."}],
        [system, {"role": "user", "content": "My name is Zed."}, answer,
         {"role": "user", "content": "What is my name?"}],
        [system, {"role": "user", "content": "Again."}]]  # the history kept, then cleared by /reset
    assert "history cleared" in result.stderr
    assert "never asked" not in result.stdout


def test_embed_prints_vectors(fake_cli):
    result = runner.invoke(app, ["embed", "one", "two words"])
    assert result.exit_code == 0
    assert json.loads(result.stdout) == [[3.0, 1.0], [9.0, 1.0]]  # the scripted engine's: [length, 1]


def test_models_list():
    result = runner.invoke(app, ["models", "list"])
    assert result.exit_code == 0
    assert "SmolLM2-135M-Instruct" in result.stdout and "transformers" in result.stdout


def test_errors_are_one_line_and_non_zero(fake_cli):
    cases = {
        ("chat", "hi", "--temperature", "2.5"): "temperature",
        ("chat", "hi", "--top-p", "1.5"): "top_p",
        ("chat", "hi", "--max-tokens", "0"): "max_tokens",
        ("chat", "hi", "--seed", "-1"): "seed",
        ("chat", "hi", "--model", "no-such-model"): "no-such-model",
        ("chat", ""): "empty",
        ("chat", "hi", "--max-tokens", "100000"): "context length",  # the engine's window (4096 on the fake)
    }
    for args, needle in cases.items():
        result = runner.invoke(app, list(args))
        assert result.exit_code == 1, args
        assert needle in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.output
        assert result.stderr.strip().startswith("error:") and result.stderr.count("\n") == 1


def test_serve_starts_and_says_where():
    """``millm serve`` in a process of its own, on the scripted engine (``python -m tests.support.cli``)."""
    import os
    import subprocess
    import sys
    import time

    import httpx

    from tests.support.live import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.cli", "serve", "--port", str(port)],
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        assert r.json()["data"][0]["id"] == "SmolLM2-135M-Instruct"
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    assert f"http://127.0.0.1:{port}/v1" in stderr and "SmolLM2-135M-Instruct" in stderr
