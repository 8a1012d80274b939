"""Request headers the server reads: X-miLLM-Strict."""

from __future__ import annotations

from millm.errors import InvalidParameter
from millm.requests.builder import STRICT_HEADER


def strict_mode(value: str | None) -> bool:
    """X-miLLM-Strict: true/1 refuse unused fields, false/0 (or absent) report them; anything else is a 400."""
    if value is None:
        return False
    normalised = value.strip()  # the spec's four values as written: TRUE or yes is "any other value"
    if normalised in ("true", "1"):
        return True
    if normalised in ("false", "0"):
        return False
    raise InvalidParameter(f"The {STRICT_HEADER} header must be true, 1, false or 0, got {value!r}.",
                           param=STRICT_HEADER)
