"""Moved to ``tests.support.live``. This name remains while bench/fuzz.py
import it; delete it once they import ``tests.support.live``."""

from tests.support.live import *  # noqa: F401,F403
