"""Resuming: what an earlier run of the same job already wrote, and the torn line it may have left.

Output lines are written whole and in input order, so a killed run leaves complete lines and at most
one torn last line. That line (and anything after it that does not parse) is cut off and answered
again; every line already answered is matched by its ``custom_id`` and skipped. Lines whose custom_id
is missing or repeated are matched by count: the k-th such line is done when the output holds k of them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def keep_whole_lines(output: Path, key: Callable[[Any], Any]) -> Counter[Any]:
    """Cut ``output`` back to its whole lines; how many lines each ``key(line)`` has there.

    A line is whole when it ends in a newline, parses, and ``key`` finds what it needs in it."""
    done: Counter[Any] = Counter()
    if not output.exists():
        return done
    raw = output.read_bytes()
    kept = 0
    for line in raw.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        try:
            done[key(json.loads(line))] += 1
        except (ValueError, KeyError, TypeError):
            break
        kept += len(line)
    if kept != len(raw):
        with output.open("r+b") as sink:
            sink.truncate(kept)
    return done


def pending(items: Sequence[T], key: Callable[[T], Any], done: Counter[Any]) -> list[T]:
    """The items not yet answered: per key, the first ``done[key]`` items are."""
    seen: Counter[Any] = Counter()
    todo = []
    for item in items:
        k = key(item)
        seen[k] += 1
        if seen[k] > done[k]:
            todo.append(item)
    return todo


def batch_key(line: dict[str, Any]) -> str:
    """An output line's custom_id as JSON, as ``BatchLine.key`` writes the input's."""
    return json.dumps(line["custom_id"])
