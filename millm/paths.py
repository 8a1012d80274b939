"""Paths a user typed (a CLI argument, a management request's ``path``): ``~`` expanded as a shell would.

A shell leaves ``~name`` as it is when no user has that name; ``Path.expanduser`` raises instead, which
turned a request's ``"~c"`` into a 500. Every user-given path goes through ``user_path``, so such a path
is simply one that does not exist, answered like any other.
"""

from __future__ import annotations

from pathlib import Path


def user_path(path: str | Path) -> Path:
    """``path`` with a leading ``~`` or ``~user`` expanded; left as given when it cannot be."""
    path = Path(path)
    try:
        return path.expanduser()
    except RuntimeError:  # no home directory for that user
        return path
