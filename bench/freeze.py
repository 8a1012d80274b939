"""One hostile request against everyone else: a response_format whose string must match ``^((a+)+c|a+)$``, while
another client polls /api/health. Before, the closed document was validated with Python's backtracking
``re`` (exponential in the string's length, holding the interpreter lock); now with RE2 (linear).

    python bench/freeze.py [--chars 26] [--interval 0.02]

Serves the bundled model in this process (Hypercorn on loopback), sends the request once with each
validator, and prints the request's time and the slowest health answer during it, before and after. The
spec's reproducer used 30 characters (42.7 s measured then); the default of 26 keeps "before" to seconds
(time x4 per 2 more characters).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import Any

import httpx

from millm.config import get_settings
from millm.engine import load_engine
from millm.registry import resolve
from millm.server.app import create_app
from millm.server.run import in_thread
from millm.structured import constraint


def reproducer(model: str, chars: int) -> dict[str, Any]:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^((a+)+c|a+)$", "minLength": chars,
                                                     "maxLength": chars}},
              "required": ["s"], "additionalProperties": False}
    return {"model": model, "messages": [{"role": "user", "content": "Say aaa."}], "max_tokens": chars + 16,
            "temperature": 0, "response_format": {"type": "json_schema",
                                                  "json_schema": {"name": "freeze", "schema": schema}}}


POLLER = """
import sys, time, httpx
base, interval = sys.argv[1], float(sys.argv[2])
with httpx.Client(timeout=600) as client:
    while True:
        start = time.perf_counter()
        client.get(base + "/api/health")
        print(time.perf_counter() - start, flush=True)
        time.sleep(interval)
"""


def run(base: str, body: dict[str, Any], interval: float) -> tuple[float, float, int]:
    """(the request's seconds, the slowest /api/health answer while it ran, health answers seen). The health
    client is a process of its own, as a real one is: it needs nothing of this process to send."""
    poller = subprocess.Popen([sys.executable, "-c", POLLER, base, str(interval)], stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)  # the poller's first answers are in before the request starts
    start = time.perf_counter()
    reply = httpx.post(base + "/v1/chat/completions", json=body, timeout=3600)
    elapsed = time.perf_counter() - start
    time.sleep(0.5)
    poller.terminate()
    out, _ = poller.communicate()
    answers = [float(line) for line in out.split()]
    assert reply.status_code == 200, reply.text
    return elapsed, max(answers, default=0.0), len(answers)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chars", type=int, default=26)
    parser.add_argument("--interval", type=float, default=0.02)
    args = parser.parse_args()
    settings = get_settings()
    engine = load_engine(resolve(settings.default_model, settings), settings)
    body = reproducer(engine.model_id, args.chars)
    linear = constraint.linear_validator
    with in_thread(create_app(settings, engine)) as base:
        httpx.post(base + "/v1/chat/completions", json=body, timeout=600)  # compile the constraint once first
        results = {}
        for name in ("before", "after"):
            if name == "before":  # Draft 2020-12 as jsonschema ships it: pattern through Python's re
                import jsonschema

                constraint.linear_validator = lambda: jsonschema.Draft202012Validator  # type: ignore[assignment]
            else:
                constraint.linear_validator = linear  # type: ignore[assignment]
            results[name] = run(base, body, args.interval)
            elapsed, slowest, answers = results[name]
            print(f"{name:6}  request {elapsed:7.2f} s   slowest /api/health {slowest:7.3f} s  ({answers} answers)")
    before, after = results["before"][1], results["after"][1]
    print(f"slowest health answer during the request: {before:.3f} s before, {after:.3f} s after "
          f"({before / max(after, 1e-6):.0f}x); {args.chars} characters")


if __name__ == "__main__":
    main()
