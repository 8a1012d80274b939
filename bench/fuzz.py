"""Fuzz a miLLM server at length with schemathesis: every /v1 and /api operation of its /openapi.json,
schema-valid and schema-violating requests; then a web page's requests to every operation (a rebound Host,
a foreign or null Origin, bodies not said to be JSON: each must get exactly its 421, 403 or 415) and every
malformed vector set and control-vector file through POST /api/vectors/import (each a 400, none stored).
Reports requests per operation, statuses, and every request that broke a property (an untyped 5xx, an error
body not in OpenAI's shape, a refusal other than the one due, /api/health silent afterwards).

    python bench/fuzz.py                      # the bundled model, 200 examples per operation and mode
    python bench/fuzz.py --examples 1000 --seed 7
    python bench/fuzz.py --url http://127.0.0.1:8000   # a running server (its /api is changed freely)

Exits non-zero when any property broke. The driver is tests/fuzzing.py, which the test suite runs briefly.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def bundled_server() -> AbstractContextManager[str]:
    """The bundled model served on a loopback port from a throwaway MILLM_HOME."""
    os.environ["MILLM_HOME"] = tempfile.mkdtemp(prefix="millm-fuzz-")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from millm.config import get_settings
    from millm.engine import load_engine
    from millm.registry import BUNDLED_ID, resolve
    from millm.server.app import create_app
    from tests.support.live import live_server

    settings = get_settings()
    return live_server(create_app(settings, load_engine(resolve(BUNDLED_ID, settings), settings)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200, help="examples per operation and mode")
    parser.add_argument("--seed", type=int, default=1, help="0: derandomised (the test suite's examples)")
    parser.add_argument("--url", help="fuzz this running server instead of starting one")
    args = parser.parse_args()
    from tests.support.fuzzing import fuzz

    with (nullcontext(args.url) if args.url else bundled_server()) as base:
        started = time.monotonic()
        report = fuzz(base, args.examples, seed=args.seed)
        took = time.monotonic() - started
    sent = sum(report.sent.values())
    print(f"{sent} requests over {len(report.sent)} operations in {took:.0f} s "
          f"({sent / max(took, 1e-9):.1f}/s)")
    print("statuses:", ", ".join(f"{status}: {count}" for status, count in sorted(report.statuses.items())))
    for label, count in sorted(report.sent.items()):
        print(f"  {count:6d}  {label}")
    print(f"{len(report.problems)} problems")
    for problem in report.problems:
        print("  " + problem)
    return 1 if report.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
