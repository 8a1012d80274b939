"""Resuming: what an earlier run of the same job already wrote, and the torn line it may have left.

Output lines are written whole and in input order, so a killed run leaves complete lines and at most
one torn last line. That line is cut off and answered again; every line already answered is matched by
its ``custom_id`` and skipped. A file holding anything else is not this job's output: it is refused,
never truncated. Lines whose custom_id
is missing or repeated are matched by count: the k-th such line is done when the output holds k of them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from millm.errors import InvalidParameter

T = TypeVar("T")
OUTPUT_START = b'{"id": "batch_req_'  # how every output line begins (``output_line``)


def keep_whole_lines(output: Path, key: Callable[[Any], Any]) -> Counter[Any]:
    """Cut a torn last line off ``output``; how many lines each ``key(line)`` has there.

    A line is whole when it ends in a newline, parses, and ``key`` finds what it needs in it. Only the
    last line may be torn (no newline yet), and only when it is the start of an output line; any other
    line that is not an output line means the file is not this job's output, and it is refused with a
    400 naming ``output`` rather than truncated.
    """
    done: Counter[Any] = Counter()
    if not output.exists():
        return done
    raw = output.read_bytes()
    kept = 0
    for line in raw.split(b"\n"):
        if kept + len(line) == len(raw):  # the last piece, with no newline after it: torn, or empty
            if not (OUTPUT_START.startswith(line) or line.startswith(OUTPUT_START)):
                raise _not_output(output, raw[:kept].count(b"\n") + 1)
            break
        try:
            done[key(json.loads(line))] += 1
        except (ValueError, KeyError, TypeError):
            raise _not_output(output, raw[:kept].count(b"\n") + 1) from None
        kept += len(line) + 1
    if kept != len(raw):
        with output.open("r+b") as sink:
            sink.truncate(kept)
    return done


def _not_output(output: Path, line: int) -> InvalidParameter:
    return InvalidParameter(f"{output} is not batch output (line {line} is not an output line), so it was left "
                            "as it is; give -o a new file, or the output of an earlier run of this job.",
                            param="output")


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
    """An output line's custom_id as JSON, as ``BatchLine.key`` writes the input's; KeyError for a line that
    is not an output line (an input line, say, which has a custom_id too)."""
    if not isinstance(line, dict) or not str(line.get("id", "")).startswith("batch_req_") or "response" not in line:
        raise KeyError("id")
    return json.dumps(line["custom_id"])
