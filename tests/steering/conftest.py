"""Fixtures of the steering tests."""

import pytest

from tests.steering.tiny import tiny_llama


@pytest.fixture
def model():
    """A fresh tiny random Llama (``tests.steering.tiny``)."""
    return tiny_llama()
