"""Moved to ``tests.support.fuzzing``. This name remains while bench/fuzz.py
import it; delete it once they import ``tests.support.fuzzing``."""

from tests.support.fuzzing import *  # noqa: F401,F403
