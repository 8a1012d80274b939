"""A batch input mixing the three endpoints, scoring, steered rows and bad lines; shared by the batch tests
(tests/cli/test_batch.py on the scripted engine, tests/cli/test_batch_ray.py on the real model)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from millm.registry import BUNDLED_ID

SAE = "smollm2-135m-res-L10"
PROFILE = "batch-weather"
MODEL = BUNDLED_ID


def chat(text: str, **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "temperature": 0, "max_tokens": 4,
            **fields}


GOOD: list[tuple[str, str, dict[str, Any]]] = [
    ("c1", "/v1/chat/completions", chat("Say hi.")),
    ("c2", "/v1/chat/completions", chat("Name a colour.")),
    ("c3", "/v1/chat/completions", chat("Count to three.", max_tokens=3)),
    ("p1", "/v1/completions", {"model": MODEL, "prompt": ["The sky is", "One, two,"], "temperature": 0,
                               "max_tokens": 3}),
    ("e1", "/v1/embeddings", {"model": MODEL, "input": ["snow", "sun"]}),
    ("s1", "/v1/completions", {"model": MODEL, "prompt": "The answer is", "max_tokens": 1, "logprobs": 2}),
    ("s2", "/v1/chat/completions", chat("Yes or no?", max_tokens=1, logprobs=True, top_logprobs=2)),
    ("steer1", "/v1/chat/completions", chat("Describe the weather.", profile=PROFILE)),
    ("steer2", "/v1/chat/completions", chat("Describe the weather.", profile=PROFILE, steering_intensity=0.5)),
    ("bad1", "/v1/chat/completions", chat("x", temperature=7)),
    ("bad2", "/v1/chat/completions", chat("x", profile="no-such-profile")),
    ("bad3", "/v1/embeddings", {"model": MODEL, "input": "x", "seed": 3}),
    ("ign", "/v1/chat/completions", chat("Say hi.", user="someone")),
    ("seed", "/v1/chat/completions", chat("Pick a word.", temperature=1, seed=7)),
    ("json", "/v1/chat/completions", chat("A JSON object, please.", max_tokens=6,
                                          response_format={"type": "json_object"})),
]
BROKEN = ['{"custom_id": "torn", "method": "POST", "url": "/v1/chat/compl',
          json.dumps({"custom_id": "route", "method": "POST", "url": "/v1/images", "body": {}}),
          json.dumps({"custom_id": "verb", "method": "GET", "url": "/v1/embeddings", "body": {}}),
          json.dumps({"custom_id": "c1", "method": "POST", "url": "/v1/embeddings", "body": {}}),
          "[1, 2]"]


def batch_text() -> str:
    lines = [json.dumps({"custom_id": c, "method": "POST", "url": u, "body": b}) for c, u, b in GOOD]
    return "\n".join(lines[:5] + BROKEN + lines[5:]) + "\n"


def write_input(folder: Path) -> Path:
    path = folder / "in.jsonl"
    path.write_text(batch_text())
    return path


def read_out(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@contextmanager
def weather_steering(target: Any) -> Iterator[str]:
    """The bundled L10 SAE attached to ``target`` with a saved profile steering it strongly, through the CLI's
    steering service; the profile deleted and the SAE detached afterwards."""
    from cli.common import steering_service

    svc = steering_service()
    svc.attach(target, SAE, 10)
    svc.save_profile({"name": PROFILE, "model": MODEL, "entries": [
        {"sae": SAE, "feature": 1604, "strength": 60.0}, {"sae": SAE, "feature": 1118, "strength": 60.0}]},
        overwrite=True)
    try:
        yield PROFILE
    finally:
        svc.delete_profile(PROFILE)
        svc.detach(target, SAE)


@pytest.fixture(scope="module")
def weather_profile(engine) -> Iterator[str]:
    """``weather_steering`` on the session's real model, for a module."""
    with weather_steering(engine.steering_target()) as name:
        yield name
