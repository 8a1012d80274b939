"""The shipped neutral prompt sets (``millm/research/prompts/VERSION.json``, package data): everyday prompts that
name no concept, in three disjoint lists:

- ``calibration``: the prompts a strength is chosen on (sweeps, screens, vector calibration);
- ``held_out``: the prompts the chosen strength is verified on; what a card's held-out rate was measured on;
- ``fresh``: prompts neither chose nor verified anything, for checking a stored held-out rate again
  (``bench/held_out.py``).

A released version is never edited: a changed list is a new file and a new version, and a card records the
version its figures were measured on (``held_out.prompt_set``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from millm.errors import InvalidParameter

PROMPT_SET = "neutral-v1"  # the version sweeps, screens and calibrations measure with
LISTS = ("calibration", "held_out", "fresh")


@dataclass(frozen=True)
class PromptSet:
    version: str
    calibration: tuple[str, ...]
    held_out: tuple[str, ...]
    fresh: tuple[str, ...]


@lru_cache(maxsize=4)
def prompt_set(version: str = PROMPT_SET) -> PromptSet:
    """The shipped prompt set ``version``; an unknown version is refused naming the ones shipped."""
    folder = resources.files("millm.research") / "prompts"
    shipped = sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))
    if version not in shipped:
        raise InvalidParameter(f"No prompt set '{version}' ships with miLLM (it has {', '.join(shipped)}).",
                               param="prompt_set")
    body = json.loads((folder / f"{version}.json").read_text(encoding="utf-8"))
    lists = {k: tuple(str(p) for p in body[k]) for k in LISTS}
    return PromptSet(str(body["version"]), lists["calibration"], lists["held_out"], lists["fresh"])
