"""Calibrating a vector set: each vector's strength chosen on the calibration prompts and verified on the held-out
prompts, as ``millm steer sweep --save`` does for an SAE feature (``millm.research.sweep.sweep_feature``: the set
attached for the sweep only, answers sampled as requests are), stored in the set's own ``features.jsonl`` (the
row keys of ``millm.sae.measured``), where cards, search and ``--steer NAME`` read an SAE's.

A vector's concept words are the ones it was learned from (``vectors.json``'s ``source.concepts``), or the words
given; a set learned from files has none of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from millm.engine.base import Engine, numerics
from millm.errors import InvalidParameter
from millm.research.held_out import unverified
from millm.research.prompt_sets import PROMPT_SET
from millm.research.saving import Measured, save_measured
from millm.research.sweep import SweepResult, sweep_feature
from millm.sae.cards import FEATURES_FILE
from millm.sae.vector_sets import read_meta
from millm.steering.service import SteeringService
from millm.vectors.catalog import record_of

STRENGTHS = (0.0, 20.0, 40.0, 60.0, 80.0, 100.0)  # a unit vector at s adds s, as a feature's decoder row does
TOKENS = 24  # tokens per answer, as ``millm steer screen`` measures features


def concept_words(folder: Path, given: Sequence[str] = ()) -> tuple[str, ...]:
    """The words that count as a vector's concept: ``given``, else the concepts the set was learned from; a set
    learned from files, with none given, is refused naming --concept."""
    words = [w.strip().lower() for w in given if w.strip()]
    if not words:
        concepts = read_meta(folder).get("source", {}).get("concepts") or []
        words = [str(c).strip().lower() for c in concepts if str(c).strip()]
    if not words:
        raise InvalidParameter(f"The vector set in {folder} was learned from files and names no concept: give the "
                               "words that count as mentioning it with --concept.", param="concept")
    return tuple(dict.fromkeys(words))


def calibrate(service: SteeringService, engine: Engine, name: str, words: Sequence[str] = (), *,
              prompts: int = 16, held_out: int = 16, tokens: int = TOKENS, seed: int = 0,
              strengths: Sequence[float] = STRENGTHS,
              on_vector: Callable[[int, int], None] | None = None) -> list[SweepResult]:
    """Every vector of the set ``name`` swept on the calibration prompts and its chosen strength verified on the
    held-out prompts; each vector's held-out measure (recommending a strength or not) stored in the set's
    ``features.jsonl`` as it is done. ``on_vector(done, total)`` hears each vector start."""
    record = record_of(service, name)
    folder = Path(record["path"])
    words = concept_words(folder, words)
    labels = service.store.label_map(name)
    (folder / FEATURES_FILE).touch()  # a set's cards start here
    results = []
    for n, index in enumerate(sorted(labels)):
        if on_vector is not None:
            on_vector(n, len(labels))
        result = sweep_feature(service, engine, name, index, label=labels[index], words=words, strengths=strengths,
                               prompts=prompts, held_out=held_out, seed=seed, tokens=tokens)
        held = result.held_out or unverified(PROMPT_SET, numerics(engine))
        save_measured(folder, {index: Measured(held, labels[index])})
        results.append(result)
    return results


def summary(results: Sequence[SweepResult]) -> list[dict[str, Any]]:
    """Per vector: its name, the strength recommended (or None) and the held-out figures."""
    return [{"name": r.label, "recommended_strength": r.recommended,
             "held_out": r.held_out.to_json() if r.held_out is not None else None} for r in results]
