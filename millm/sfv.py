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


def sf_string_value(item: str) -> str:
    """The text an ``sf_string`` item holds (the inverse of ``sf_string``); an unquoted item is returned as is."""
    if len(item) < 2 or not (item.startswith('"') and item.endswith('"')):
        return item
    raw, out, i = item[1:-1], bytearray(), 0
    while i < len(raw):
        ch = raw[i]
        if ch == "\\" and i + 1 < len(raw):
            out += raw[i + 1].encode()
            i += 2
        elif ch == "%" and _is_hex(raw[i + 1:i + 3]):
            out.append(int(raw[i + 1:i + 3], 16))
            i += 3
        else:
            out += ch.encode()
            i += 1
    return out.decode("utf-8", "replace")


def _is_hex(pair: str) -> bool:
    return len(pair) == 2 and all(c in "0123456789abcdefABCDEF" for c in pair)


def sf_decimal(value: float) -> str:
    """An RFC 8941 sf-decimal: at most three fractional digits, at least one (``0.5``, ``1.0``, ``0.333``)."""
    whole, _, frac = f"{value:.3f}".partition(".")
    return f"{whole}.{frac.rstrip('0') or '0'}"
