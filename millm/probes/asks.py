"""A request's ``probes`` field: the probes it asks for besides the attached ones, each a name or ``{"name",
"action"?, "profile"?}`` (its shape checked here; the action against the probe once it is loaded,
``millm.probes.serving``). Imports no torch: request building reads it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from millm.errors import InvalidParameter
from millm.names import check_name

MAX_PROBES = 16  # probes one request may ask for


@dataclass(frozen=True)
class Ask:
    """A probe a request asks for (or one attached): its name and what it does when it fires."""

    name: str
    action: str = "flag"
    profile: str | None = None
    param: str = "action"  # how a refusal of its action names it (a request's ``probes[i].action``)


def parse_asks(value: Any, param: str = "probes") -> tuple[Ask, ...]:
    """The ``probes`` field: a list of names or ``{"name", "action"?, "profile"?}`` objects (shape only: the
    action is checked against the probe once it is loaded)."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_PROBES:
        raise InvalidParameter(f"'{param}' must be a list of at most {MAX_PROBES} probe names or objects.",
                               param=param)
    asks: list[Ask] = []
    for i, item in enumerate(value):
        where = f"{param}[{i}]"
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, dict) or set(item) - {"name", "action", "profile"}:
            raise InvalidParameter(f"'{where}' must be a probe's name or an object with 'name', 'action' and "
                                   "'profile' only.", param=where)
        check_name(item.get("name"), f"{where}.name")
        asks.append(Ask(item["name"], item.get("action", "flag"), item.get("profile"), f"{where}.action"))
    if len({a.name for a in asks}) != len(asks):
        raise InvalidParameter(f"'{param}' names a probe twice.", param=param)
    return tuple(asks)
