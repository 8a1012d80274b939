"""Moved to ``tests.support.saes``. This name remains while the tests of tests/vectors/
import it; delete it once they import ``tests.support.saes``."""

from tests.support.saes import *  # noqa: F401,F403
