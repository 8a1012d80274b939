"""The fast tier collects without torch: ``pytest -m "not model" --collect-only`` imports no torch,
transformers or llama.cpp, so its collection costs seconds, not the time those imports take.

Test modules and conftest files import what pulls torch inside the tests and fixtures that use it; a test
may import torch when it runs. A failure names the import chain that loaded it first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_fast_tier_collects_without_torch(tmp_path: Path) -> None:
    report = tmp_path / "loaded.json"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "not model", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-p", "tests.support.collection"],
        cwd=ROOT, env={**os.environ, "MILLM_COLLECTED_MODULES": str(report)}, capture_output=True, text=True,
        timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    loaded = json.loads(report.read_text())
    assert not loaded, "collection imported " + "; ".join(f"{name} (first by {' > '.join(chain)})"
                                                          for name, chain in loaded.items())
