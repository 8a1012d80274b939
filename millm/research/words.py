"""Concept words and mentions: what counts as an answer mentioning a concept. Pure functions."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any


def _is_word(term: str) -> bool:
    return term.isalpha() and len(term) >= 3


def label_words(label: str) -> tuple[str, ...]:
    """A label's terms (``"rain, storm, weather"``) that are words: what counts as mentioning its concept."""
    terms = (t.strip().lower() for t in label.split(","))
    return tuple(dict.fromkeys(t for t in terms if _is_word(t)))


def top_token_words(row: dict[str, Any]) -> tuple[str, ...]:
    """A ``features.jsonl`` row's top tokens that are words (what bench/sae_quality.py counts as mentions)."""
    return tuple(str(t) for t, _ in row.get("top_tokens") or [] if _is_word(str(t)))


NOT_PLURALS = frozenset({"news", "ones", "means", "lots", "thanks", "series", "species"})  # "new" is not their singular


def _singulars(word: str) -> list[str]:
    if word in NOT_PLURALS:
        return []
    if word.endswith("ies") and len(word) > 4:
        return [word[:-3] + "y", word[:-1]]  # "cities", "movies"
    if word.endswith("es") and word[:-2].endswith(("x", "ch", "sh", "ss", "z")):
        return [word[:-2]]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")) and len(word) > 3:
        return [word[:-1]]
    return []


def word_forms(word: str) -> tuple[str, ...]:
    """A concept word with its plural and its singular, all naming one concept: a label's term is often a
    plural ("dogs") that an answer says in the singular, or the other way round ("city", "cities")."""
    plurals = [word + "s", word + "es"] + ([word[:-1] + "ies"] if word.endswith("y") else [])
    return tuple(dict.fromkeys([word, *plurals, *_singulars(word)]))


def mentions(text: str, words: Iterable[str]) -> bool:
    """A word, its plural or its singular (:func:`word_forms`), as a whole word (any case)."""
    forms = [re.escape(f) for w in words for f in word_forms(w)]
    return bool(forms) and re.search(rf"\b(?:{'|'.join(forms)})\b", text, re.IGNORECASE) is not None


def concept_rate(answers: Sequence[str], words: Iterable[str]) -> float:
    """The share of ``answers`` that mention one of ``words``."""
    words = tuple(words)
    return sum(mentions(a, words) for a in answers) / len(answers) if answers else 0.0
