"""Load time of the default model: first load (dequantising the GGUF) vs the cached load.

    python bench/load.py

Uses a fresh temporary MILLM_HOME so the first load really is the first.
"""

from __future__ import annotations

import os
import tempfile
import time

os.environ["MILLM_HOME"] = tempfile.mkdtemp(prefix="millm-bench-load-")

from millm.config import get_settings  # noqa: E402
from millm.engine import load_engine  # noqa: E402
from millm.registry import resolve  # noqa: E402


def timed_load() -> float:
    settings = get_settings()
    start = time.perf_counter()
    load_engine(resolve(settings.default_model, settings), settings)
    return time.perf_counter() - start


def main() -> None:
    first, cached = timed_load(), timed_load()
    print(f"first load (dequantise + cache): {first:6.2f} s")
    print(f"cached load:                     {cached:6.2f} s")
    print(f"speed-up:                        {first / cached:6.1f}x")


if __name__ == "__main__":
    main()
