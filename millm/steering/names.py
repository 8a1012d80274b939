"""The one rule for names of saved steering objects (profiles, clusters, circuits).

Names appear in URLs (/api/clusters/{name}), response headers and file names, so they are kept to a
safe set: ASCII letters, digits, ``-``, ``_``, ``.`` and space, 1-64 characters, starting with a letter
or digit and not ending in a space.
"""

from __future__ import annotations

import re

from millm.errors import InvalidParameter

NAME_MAX = 64
NAME_PATTERN = re.compile(rf"[A-Za-z0-9](?:[A-Za-z0-9_. -]{{0,{NAME_MAX - 2}}}[A-Za-z0-9_.-])?")
NAME_RULE = (f"1-{NAME_MAX} characters of letters, digits, '-', '_', '.' and space, "
             "starting with a letter or digit and not ending in a space")


def name_problem(name: object) -> str | None:
    """Why ``name`` is not a valid name, or None when it is."""
    if not isinstance(name, str):
        return f"must be a string of {NAME_RULE}"
    if NAME_PATTERN.fullmatch(name) is None:
        return f"must be {NAME_RULE}; got {name!r}"
    return None


def check_name(name: object, param: str = "name") -> str:
    """``name`` when it follows the rule; otherwise a 400 naming ``param``."""
    problem = name_problem(name)
    if isinstance(name, str) and problem is None:
        return name
    raise InvalidParameter(f"'{param}' {problem}.", param=param)
