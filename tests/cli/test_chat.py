"""The ``millm`` CLI through Typer's runner, on the real bundled model."""

import json

from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


def test_chat_answers(engine):
    result = runner.invoke(app, ["chat", "What is the capital of France?", "--temperature", "0", "--max-tokens", "20"])
    assert result.exit_code == 0, result.output
    assert "Paris" in result.stdout


def test_chat_stop_and_seed(engine):
    args = ["chat", "Name a fruit.", "--temperature", "1", "--seed", "4", "--max-tokens", "12"]
    a, b = runner.invoke(app, args), runner.invoke(app, args)
    assert a.exit_code == 0 and a.stdout == b.stdout
    cut = runner.invoke(app, ["chat", "What is the capital of France?", "--temperature", "0", "--stop", "Paris"])
    assert cut.exit_code == 0 and "Paris" not in cut.stdout and "capital" in cut.stdout


def test_chat_reads_piped_stdin(engine):
    result = runner.invoke(app, ["chat", "--temperature", "0", "--max-tokens", "20"],
                           input="What is the capital of France?")
    assert result.exit_code == 0 and "Paris" in result.stdout


def test_interactive_chat_keeps_history_and_resets(engine):
    result = runner.invoke(app, ["chat", "-i", "--temperature", "0", "--max-tokens", "12",
                                 "--system", "Answer in one short sentence."],
                           input="My name is Zed.\nWhat is my name?\n/reset\n/exit\nnever asked\n")
    assert result.exit_code == 0, result.output
    assert "Zed" in result.stdout.split("What is my name?")[-1]
    assert "history cleared" in result.stderr
    assert "never asked" not in result.stdout


def test_embed_prints_vectors(engine):
    result = runner.invoke(app, ["embed", "one", "two words"])
    assert result.exit_code == 0
    vectors = json.loads(result.stdout)
    assert len(vectors) == 2 and len(vectors[0]) == engine.model.config.hidden_size


def test_models_list(engine):
    result = runner.invoke(app, ["models", "list"])
    assert result.exit_code == 0
    assert "SmolLM2-135M-Instruct" in result.stdout and "transformers" in result.stdout


def test_errors_are_one_line_and_non_zero(engine):
    cases = {
        ("chat", "hi", "--temperature", "2.5"): "temperature",
        ("chat", "hi", "--top-p", "1.5"): "top_p",
        ("chat", "hi", "--max-tokens", "0"): "max_tokens",
        ("chat", "hi", "--seed", "-1"): "seed",
        ("chat", "hi", "--model", "no-such-model"): "no-such-model",
        ("chat", ""): "empty",
        ("chat", "hi", "--max-tokens", "100000"): "context length",
    }
    for args, needle in cases.items():
        result = runner.invoke(app, list(args))
        assert result.exit_code == 1, args
        assert needle in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.output
        assert result.stderr.strip().startswith("error:") and result.stderr.count("\n") == 1


def test_serve_starts_and_says_where(engine, settings):
    import os
    import subprocess
    import sys
    import time

    import httpx

    from tests.support.live import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--port", str(port)], stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ))
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
