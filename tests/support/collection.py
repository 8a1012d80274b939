"""A pytest plugin for tests/test_collection.py: after collection, write which heavy modules are loaded, and
the test module whose import first loaded each, to the JSON file MILLM_COLLECTED_MODULES names.

Loaded with ``-p tests.support.collection``, before any conftest or test module is imported.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from importlib.abc import MetaPathFinder
from pathlib import Path
from typing import Any

HEAVY = ("torch", "transformers", "llama_cpp")
FIRST: dict[str, list[str]] = {}  # a heavy module -> the project frames that first imported it


class _Watch(MetaPathFinder):
    """Records who imports a heavy module first; finds nothing itself."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name in HEAVY and name not in FIRST and name not in sys.modules:
            root = str(Path(__file__).resolve().parents[2])
            FIRST[name] = [f"{Path(f.filename).relative_to(root)}:{f.lineno}" for f in traceback.extract_stack()
                           if f.filename.startswith(root) and "tests/support/collection.py" not in f.filename]
        return None


sys.meta_path.insert(0, _Watch())


def pytest_collection_finish(session: Any) -> None:
    out = os.environ.get("MILLM_COLLECTED_MODULES")
    if out:
        loaded = {name: FIRST.get(name, ["(before collection)"]) for name in HEAVY if name in sys.modules}
        Path(out).write_text(json.dumps(loaded))
