"""Schemathesis against a live server on the bundled model (issue 16, Prove: fuzzing): every /v1 and /api
operation of /openapi.json gets a bounded number of schema-valid and schema-violating requests; no 5xx but
the spec's typed ones, every error body in OpenAI's shape, and /api/health answers afterwards.
``bench/fuzz.py`` runs the same driver at length."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from millm.config import Settings
from millm.engine import load_engine
from millm.registry import BUNDLED_ID, resolve
from tests.support.fuzzing import fuzz, problem_of
from tests.support.live import live_server

EXAMPLES = 4  # per operation and mode: about a minute on two cores


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory, settings: Settings) -> Iterator[str]:
    """A server of its own (own home, own engine): the fuzz registers, attaches, loads and deletes freely."""
    from millm.server.app import create_app

    home = tmp_path_factory.mktemp("fuzz-home")
    own = Settings(home=home, cache=settings.cache_dir)
    engine = load_engine(resolve(BUNDLED_ID, own), own)
    with live_server(create_app(own, engine)) as base:
        yield base
    engine.close()


@pytest.mark.model
def test_fuzzing_finds_no_untyped_5xx_and_only_openai_error_bodies(fuzzed):
    report = fuzz(fuzzed, EXAMPLES)
    assert sum(report.sent.values()) > 200
    assert report.statuses[200] > 0 and report.statuses[400] > 0  # both sides of validation were reached
    assert report.problems == []
    assert httpx.get(fuzzed + "/api/health", timeout=10).json() == {"status": "ok"}


def test_openapi_describes_every_request_body(tmp_path: Path):
    """Each route that reads a JSON body (/v1 and /api) has its requestBody in /openapi.json."""
    from millm.server.app import create_app
    from millm.server.openapi import build

    app = create_app(Settings(home=tmp_path))
    doc = build(app)
    readers = {endpoint for endpoint, view in app.view_functions.items()
               if "await body()" in inspect.getsource(view) or "await _set_values(" in inspect.getsource(view)}
    readers |= {"v1.chat_completions", "v1.completions", "v1.embeddings"}
    described = {op["operationId"].rsplit("_", 1)[0] for ops in doc["paths"].values() for op in ops.values()
                 if "requestBody" in op}
    assert {"api.put_steering", "api.patch_steering", "api.add_sae", "steering_docs.import_circuit"} <= readers
    assert readers <= described


@pytest.mark.parametrize("status,text,bad", [
    (200, "anything", False),
    (400, '{"error": {"message": "m", "type": "invalid_request_error", "param": null, "code": "x"}}', False),
    (503, '{"error": {"message": "m", "type": "server_error", "param": null, "code": "queue_full"}}', False),
    (500, '{"error": {"message": "m", "type": "server_error", "param": null, "code": "internal_error"}}', True),
    (400, '{"detail": "x"}', True),
    (404, "<html>not found</html>", True),
])
def test_the_fuzz_properties(status, text, bad):
    assert (problem_of(status, "application/json", text) is not None) == bad
