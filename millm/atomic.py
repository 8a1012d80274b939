"""Files replaced in one step: a reader sees the old file or the new one, and a killed write leaves the old one.

Every store file miLLM rewrites (an SAE's ``features.jsonl``, the model registry, the pulled-models ledger, a
probe) goes through :func:`replace_text`. ``tempfile.mkstemp`` would create the staging file readable by its owner
alone, and the rename would hand that mode to the file it replaces: an SAE folder shared with a group turned
unreadable to it after one ``--save``. Here a new file gets the mode any new file gets (the umask's), and a
replaced file keeps the mode it had.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path


def replace_text(path: Path, text: str, durable: bool = False) -> None:
    """``text`` as the file at ``path`` (its folder must exist), replaced in one step; ``durable`` also waits for
    the disk before the rename, for a file whose loss would lose the user's work (the registry)."""
    staging = path.with_name(f".{path.name}-{secrets.token_hex(6)}.tmp")
    try:
        with open(staging, "x", encoding="utf-8") as f:  # created as any file is (the umask's mode)
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        try:
            os.chmod(staging, stat.S_IMODE(path.stat().st_mode))  # the file replaced keeps its mode
        except FileNotFoundError:
            pass
        os.replace(staging, path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
