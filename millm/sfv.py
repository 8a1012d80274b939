"""RFC 8941 structured-field serialisation: the bare items miLLM's response headers are made of. Pure."""

from __future__ import annotations


def sf_string(value: str) -> str:
    """An RFC 8941 sf-string. Characters outside printable ASCII are percent-encoded (as UTF-8)."""
    out = []
    for ch in value:
        if ch == "%" or not " " <= ch <= "~":
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8")))
        elif ch in '"\\':
            out.append("\\" + ch)
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def sf_decimal(value: float) -> str:
    """An RFC 8941 sf-decimal: at most three fractional digits, at least one (``0.5``, ``1.0``, ``0.333``)."""
    whole, _, frac = f"{value:.3f}".partition(".")
    return f"{whole}.{frac.rstrip('0') or '0'}"
