"""The one rule for names of saved steering objects (profiles, clusters, circuits).

Names appear in URLs (/api/clusters/{name}), response headers and file names, so they are kept to a
safe set: ASCII letters, digits, ``-``, ``_``, ``.`` and space, 1-64 characters, starting with a letter
or digit and not ending in a space. The words the management API's routes use beside a name
(``/api/profiles/import``, ``/api/profiles/deactivate``, ``/api/circuits/active``) are not names, so a
route never has to guess which one a path means.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, ValidationInfo

from millm.errors import InvalidParameter
from millm.sfv import sf_string, sf_string_value

NAME_MAX = 64
NAME_PATTERN = re.compile(rf"[A-Za-z0-9](?:[A-Za-z0-9_. -]{{0,{NAME_MAX - 2}}}[A-Za-z0-9_.-])?")
ROUTE_WORDS = frozenset({"import", "deactivate", "active", "learn", "jobs"})
NAME_RULE = (f"1-{NAME_MAX} characters of letters, digits, '-', '_', '.' and space, "
             "starting with a letter or digit and not ending in a space, and not "
             + ", ".join(f"'{w}'" for w in sorted(ROUTE_WORDS)))


def name_problem(name: object) -> str | None:
    """Why ``name`` is not a valid name, or None when it is."""
    if not isinstance(name, str):
        return f"must be a string of {NAME_RULE}"
    if NAME_PATTERN.fullmatch(name) is None or name in ROUTE_WORDS:
        return f"must be {NAME_RULE}; got {name!r}"
    return None


def check_name(name: object, param: str = "name") -> str:
    """``name`` when it follows the rule; otherwise a 400 naming ``param``."""
    problem = name_problem(name)
    if isinstance(name, str) and problem is None:
        return name
    raise InvalidParameter(f"'{param}' {problem}.", param=param)


STORED = {"stored": True}
"""Validation context for a document read back from the store: its name was checked when it came in, and
one stored before the rule (or behind the API's back) must still be readable, to use or delete."""


def _named(value: str, info: ValidationInfo) -> str:
    if isinstance(info.context, dict) and info.context.get("stored"):
        return value
    problem = name_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


Name = Annotated[str, AfterValidator(_named)]
"""A pydantic field type holding a name that follows the rule."""

STEERING_STATES = frozenset({"none", "live"})


def steering_header(label: str, scope: str = "all") -> str:
    """The X-miLLM-Steering value: the sf-token ``none`` or ``live``, or a profile's name as an sf-string
    (``"weather"``), so a profile named ``live`` is never mistaken for the state and no stored name,
    whatever it holds, can break a response. A steered response whose steering applies to part of the
    positions says which as a parameter (``live;scope=generated``); ``all``, the default, is not written."""
    item = label if label in STEERING_STATES else sf_string(label)
    return item if label == "none" or scope == "all" else f"{item};scope={scope}"


def _item_end(header: str) -> int:
    """Where the item of an sf-item ``header`` ends (its parameters, if any, follow)."""
    if not header.startswith('"'):
        return len(header.split(";", 1)[0])
    i = 1
    while i < len(header) and header[i] != '"':
        i += 2 if header[i] == "\\" else 1
    return i + 1


def steering_label(header: str) -> str:
    """What an X-miLLM-Steering value says: ``none``, ``live`` or the profile's name (a client's reading)."""
    item = header[:_item_end(header)]
    return item if item in STEERING_STATES else sf_string_value(item)


def steering_scope_of(header: str) -> str:
    """The scope an X-miLLM-Steering value reports (``all`` when it names none)."""
    for param in header[_item_end(header):].split(";"):
        key, _, value = param.strip().partition("=")
        if key == "scope" and value:
            return value
    return "all"
