"""The decode loop's one driver (``millm.engine.decode.driver``): every front end is its client, so the model
running out of memory (scripted: the scheduler's forward raises torch's OutOfMemoryError) is the same
insufficient_memory error, with the same message, under the server, the TUI, ``millm chat``, ``millm batch`` and
research; and the engine answers again afterwards."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

SCRIPTED = "CUDA out of memory. Tried to allocate 20.00 GiB (scripted)"
CODE = "insufficient_memory"
QUESTION = "What is the capital of France?"


@pytest.fixture
def out_of_memory(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every scheduler forward runs out of memory while the test runs; yields the message each front end must
    show (the driver's one mapping of it)."""
    import torch

    from millm.engine.decode.driver import typed
    from millm.engine.decode.scheduler import Scheduler
    from millm.errors import MillmError

    error = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)

    def forward(*_: object, **__: object) -> None:
        raise error(SCRIPTED)

    monkeypatch.setattr(Scheduler, "_forward", forward)
    mapped = typed(error(SCRIPTED))
    assert isinstance(mapped, MillmError) and mapped.code == CODE
    yield mapped.message


def _server(server: str, model: str) -> tuple[str, str]:
    import httpx

    body = {"model": model, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 4, "temperature": 0}
    response = httpx.post(server + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    return error["code"], error["message"]


def _tui(engine) -> tuple[str, str]:
    from millm.errors import MillmError
    from tui.local import LocalClient

    async def ask() -> tuple[str, str]:
        client = LocalClient(engine)
        try:
            async for _ in client.chat({"model": engine.model_id, "messages": [{"role": "user", "content": QUESTION}],
                                        "max_tokens": 4, "temperature": 0}):
                pass
        except MillmError as exc:
            return exc.code, exc.message
        finally:
            await client.close()
        raise AssertionError("the TUI's chat did not fail")

    return asyncio.run(ask())


def _chat(engine, monkeypatch: pytest.MonkeyPatch) -> str:
    import cli.common
    from cli.main import app

    monkeypatch.setattr(cli.common, "ENGINE_FACTORY", lambda _: engine)
    result = CliRunner().invoke(app, ["chat", QUESTION, "--temperature", "0", "--max-tokens", "4"])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)  # a clear line, no traceback
    return str(result.stderr)


def _batch(engine, monkeypatch: pytest.MonkeyPatch, folder: Path) -> tuple[str, str]:
    import cli.common
    from cli.main import app

    monkeypatch.setattr(cli.common, "ENGINE_FACTORY", lambda _: engine)
    line = {"custom_id": "q", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": engine.model_id, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 4,
                     "temperature": 0}}
    src, out = folder / "in.jsonl", folder / "out.jsonl"
    src.write_text(json.dumps(line) + "\n")
    result = CliRunner().invoke(app, ["batch", str(src), "-o", str(out)])
    assert result.exit_code == 0, result.output
    response = json.loads(out.read_text().splitlines()[0])["response"]
    assert response["status_code"] == 503, response
    error = response["body"]["error"]
    return error["code"], error["message"]


def _research(engine) -> tuple[str, str]:
    from millm.errors import MillmError
    from millm.research.answers import sample_answers

    with pytest.raises(MillmError) as caught:
        sample_answers(engine, [QUESTION], seed=1, max_tokens=4)
    return caught.value.code, caught.value.message


def test_out_of_memory_is_one_error_under_every_front_end(engine, server, out_of_memory, monkeypatch, tmp_path):
    message = out_of_memory
    assert SCRIPTED in message
    assert _server(server, engine.model_id) == (CODE, message)
    assert _tui(engine) == (CODE, message)
    assert _batch(engine, monkeypatch, tmp_path) == (CODE, message)
    assert _research(engine) == (CODE, message)
    assert message in " ".join(_chat(engine, monkeypatch).split())  # the terminal may wrap the line


def test_the_engine_answers_again_after_running_out_of_memory(engine, monkeypatch):
    from millm.engine.decode.driver import run
    from millm.engine.events import Delta
    from millm.errors import InsufficientMemory
    from tests.support.scheduler import alone, plan

    asked = plan(engine, "The capital of France is", max_tokens=6)
    expected = alone(engine, asked)
    with monkeypatch.context() as patched:
        import torch

        from millm.engine.decode.scheduler import Scheduler

        def forward(*_: object, **__: object) -> None:
            raise torch.cuda.OutOfMemoryError(SCRIPTED)

        patched.setattr(Scheduler, "_forward", forward)
        with pytest.raises(InsufficientMemory):
            list(run(engine, [asked]))
    assert "".join(e.text for e in run(engine, [asked]) if isinstance(e, Delta)) == expected[0]


def test_a_request_routes_to_the_batch_unless_it_is_a_fallback(engine):
    from millm.engine.decode.driver import BatchSettings, route
    from tests.support.scheduler import plan

    batching = BatchSettings(max_rows=4, max_tokens=4 * 256, prefill_chunk=64)
    assert route(engine, [plan(engine, "Hi", max_tokens=4)], batching) == (False, None)
    assert route(engine, [plan(engine, "Hi", max_tokens=4, seed=3)], batching) == (True, "seed")
    assert route(engine, [plan(engine, "Hi", max_tokens=4)], None) == (True, None)  # batching off: all alone
