"""Moved to ``tests.support.fakes``. This name remains while tests/test_docs_reference.py imports it (and
docs/contributing.md names tests/fakes.py); delete it once they name ``tests.support.fakes``."""

from tests.support.fakes import *  # noqa: F401,F403
