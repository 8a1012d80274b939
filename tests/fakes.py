"""Moved to ``tests.support.fakes``. This name remains while tests/test_docs_reference.py and docs/contributing.md
import it; delete it once they import ``tests.support.fakes``."""

from tests.support.fakes import *  # noqa: F401,F403
