"""Paths a user typed (a CLI argument, a management request's ``path``): ``~`` expanded as a shell would.

A shell leaves ``~name`` as it is when no user has that name; ``Path.expanduser`` raises instead, which
turned a request's ``"~c"`` into a 500. Every user-given path goes through ``user_path``, so such a path
is simply one that does not exist, answered like any other.
"""

from __future__ import annotations

import os
from pathlib import Path

from millm.errors import InvalidParameter


def user_path(path: str | Path) -> Path:
    """``path`` with a leading ``~`` or ``~user`` expanded; left as given when it cannot be."""
    path = Path(path)
    try:
        return path.expanduser()
    except RuntimeError:  # no home directory for that user
        return path


def output_file(path: str | Path, name: str) -> Path:
    """A file a command writes (``-o``, ``--out``), checked before the work that fills it: not a folder, a
    regular file if it exists, else one a writable folder can take; otherwise a 400 naming ``name``."""
    path = user_path(path)
    if path.is_dir():
        raise InvalidParameter(f"{path} is a folder; '{name}' takes a file.", param=name)
    if path.exists() and not path.is_file():
        raise InvalidParameter(f"{path} is not a regular file; '{name}' takes a file.", param=name)
    if not path.parent.is_dir():
        raise InvalidParameter(f"'{name}' {path}: the folder {path.parent} does not exist.", param=name)
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise InvalidParameter(f"'{name}' {path}: not writable here.", param=name)
    return path
