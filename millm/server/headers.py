"""miLLM's response headers, rendered as RFC 8941 structured fields."""

from __future__ import annotations

from millm.builder import STRICT_HEADER
from millm.errors import InvalidParameter
from millm.sfv import sf_string

IGNORED_FIELDS_HEADER_MAX_BYTES = 1024


def ignored_fields(locations: list[str], limit: int = IGNORED_FIELDS_HEADER_MAX_BYTES) -> str | None:
    """The X-miLLM-Ignored-Fields value: an sf-list of locations, ending in "+N more" past ``limit`` bytes."""
    if not locations:
        return None
    items = [sf_string(loc) for loc in locations]
    full = ", ".join(items)
    if len(full) <= limit:
        return full
    kept: list[str] = []
    for i, item in enumerate(items):
        left_after = len(items) - i - 1
        if len(", ".join([*kept, item, sf_string(f"+{left_after} more")])) > limit:
            break
        kept.append(item)
    return ", ".join([*kept, sf_string(f"+{len(items) - len(kept)} more")])


def strict_mode(value: str | None) -> bool:
    """X-miLLM-Strict: true/1 refuse unused fields, false/0 (or absent) report them; anything else is a 400."""
    if value is None:
        return False
    normalised = value.strip().lower()
    if normalised in ("true", "1"):
        return True
    if normalised in ("false", "0"):
        return False
    raise InvalidParameter(f"The {STRICT_HEADER} header must be true, 1, false or 0, got {value!r}.",
                           param=STRICT_HEADER)


def seed_header(seed: int | None, scope: str) -> str | None:
    """X-miLLM-Seed: the seed and the scope of the reproducibility promise; absent without a seed."""
    return None if seed is None else f'{seed};scope="{scope}"'
