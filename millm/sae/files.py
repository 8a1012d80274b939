"""A file a client names, read within bounds: a regular file (never a FIFO, a device or a folder) of at most so
many bytes, else a 400 naming it as the client gave it. Vector sets, control-vector GGUFs and example files are
read through these.
"""

from __future__ import annotations

import errno
import stat
from pathlib import Path

from millm.errors import InvalidParameter


def regular_file(path: Path, shown: str, limit: int, param: str) -> int:
    """The size of ``path`` when it is a regular file of at most ``limit`` bytes; else a 400 naming ``shown`` (the
    path as the client gave it). Nothing else is opened: a FIFO blocks its reader until a writer comes, and
    ``/dev/zero`` never ends."""
    try:
        info = path.stat()
    except (OSError, ValueError) as exc:  # no such file, a symlink loop, a name too long, a NUL in it
        if not isinstance(exc, OSError) or exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise InvalidParameter(f"{shown}: no such file.", param=param) from None
        raise InvalidParameter(f"{shown}: cannot be read ({exc.strerror}).", param=param) from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode) else \
            "a device or socket"
        raise InvalidParameter(f"{shown}: is {kind}, not a regular file.", param=param)
    if info.st_size > limit:
        raise InvalidParameter(f"{shown}: holds {info.st_size} bytes; at most {limit} are read.", param=param)
    return info.st_size


def read_capped(path: Path, shown: str, limit: int, param: str) -> bytes:
    """The bytes of the regular file ``path`` (``regular_file``), never more than ``limit`` of them (a file that
    grows while read is refused too)."""
    regular_file(path, shown, limit, param)
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise InvalidParameter(f"{shown}: cannot be read ({exc.strerror}).", param=param) from None
    if len(data) > limit:
        raise InvalidParameter(f"{shown}: holds more than {limit} bytes.", param=param)
    return data
