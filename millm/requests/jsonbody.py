"""The rules every request body's JSON meets, over HTTP and in ``millm batch`` lines alike: strict UTF-8, a
nesting limit, no lone surrogates, no NaN.

A body that fails here is the client's error (400 invalid_parameter naming where), decided before any
model work; without this, such bodies reached the tokenizer, SQLite or a header encoder and answered 500.
"""

from __future__ import annotations

import json
import math
from typing import Any

from millm.errors import InvalidParameter

MAX_DEPTH = 128  # JSON nesting levels; a 32-deep response_format schema needs about 70
BOM = b"\xef\xbb\xbf"


def _where(path: list[str | int]) -> str:
    """A location as the errors name it: ``messages[0].content``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "body"


def _refuse(message: str, path: list[str | int]) -> InvalidParameter:
    where = _where(path)
    return InvalidParameter(f"'{where}' {message}.", param=where if path else None)


def _printable(key: str) -> str:
    """A key as an error may name it (a lone surrogate cannot be encoded anywhere)."""
    return key.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")


def is_utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (no lone surrogate, the trace of input that was not UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


KeyPath = list[str | int]  # where a value sits in the body: its keys and indices from the top


def _check_scalar(node: Any, path: KeyPath) -> None:
    """A string encodable as UTF-8, a float finite; any other scalar passes."""
    if isinstance(node, str) and not is_utf8(node):
        raise _refuse("holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text", path)
    if isinstance(node, float) and not math.isfinite(node):
        raise _refuse(f"is {node!r}, which JSON does not allow", path)


def _children(node: dict[Any, Any] | list[Any], path: KeyPath, max_depth: int) -> list[tuple[Any, KeyPath]]:
    """An object's or array's values with their paths, in order; the container itself within ``max_depth`` and
    every key encodable as UTF-8."""
    if len(path) >= max_depth:
        raise _refuse(f"nests deeper than {max_depth} levels", path)
    items = node.items() if isinstance(node, dict) else enumerate(node)
    children: list[tuple[Any, KeyPath]] = []
    for key, child in items:
        if isinstance(key, str) and not is_utf8(key):
            raise _refuse(f"has a key holding a lone UTF-16 surrogate ('{_printable(key)}')", path)
        children.append((child, [*path, key]))
    return children


def check_value(value: Any, max_depth: int = MAX_DEPTH) -> None:
    """Every string and key encodable as UTF-8, every number finite, nesting at most ``max_depth``.

    Iterative, so a value nested past Python's recursion limit is refused rather than crashing the walk."""
    stack: list[tuple[Any, KeyPath]] = [(value, [])]
    while stack:
        node, path = stack.pop()
        if isinstance(node, (dict, list)):
            stack += _children(node, path, max_depth)
        else:
            _check_scalar(node, path)


def decode(raw: bytes) -> Any:
    """The JSON value of a request body (UTF-8, RFC 8259; a UTF-8 byte-order mark is ignored)."""
    try:
        text = raw.removeprefix(BOM).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidParameter(f"The request body is not UTF-8 (byte {exc.start}); JSON bodies must be UTF-8.") \
            from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise InvalidParameter(f"The request body nests deeper than {MAX_DEPTH} levels.") from None
    except ValueError as exc:
        raise InvalidParameter(f"The request body is not valid JSON: {exc}.") from None
    check_value(value)
    return value
