"""Labelling an SAE's live features from the contexts that activate them, and finding features by label.

For every feature the labeller keeps its top activations over a labelling set of tokens. Its label is
the few tokens that dominate those activations, each token's weight being its summed activation times
its inverse document frequency over the labelling set (so "the" does not name every feature). Files
written next to the SAE:

- ``labels.json``: ``{"123": "rain, storm, weather"}`` for every live feature (what registries read);
- ``features.jsonl``: one object per live feature: index, label, activation frequency, max
  activation, weighted top tokens, example contexts (the active token in «»), and the tokens the
  feature's decoder direction promotes through the unembedding (logit lens: what steering it says).

Search (``millm sae features --search``, ``GET /api/saes/{id}/features?q=``, the TUI) ranks with :func:`rank`:
whole-word label matches, then features measured to steer, then other substring matches.
Name resolution (``--steer weather=60``) takes the first non-empty tier of: features whose label
starts with the name, features with the name as one of their label's terms, features whose label
contains it; exactly one feature must be in that tier, else the error lists the candidates.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from millm.errors import InvalidParameter
from millm.sae.cards import FEATURES_FILE, LABELS_FILE, held_out_measures, index_of, read_labels_json
from millm.sae.measured import HeldOut
from millm.sae.model import SAE


@dataclass
class FeatureRecord:
    """What ``features.jsonl`` says about one live feature."""

    index: int
    label: str
    frequency: float  # fraction of labelling tokens on which it fires
    max_activation: float
    top_tokens: list[tuple[str, float]] = field(default_factory=list)
    examples: list[dict[str, Any]] = field(default_factory=list)
    promotes: list[str] = field(default_factory=list)


@dataclass
class TopActivations:
    """Per feature: its ``m`` largest activations, the rows they happened at, and firing counts."""

    values: torch.Tensor  # [m, d_sae], descending
    rows: torch.Tensor  # [m, d_sae], indices into the labelling rows
    fired: torch.Tensor  # [d_sae] how many rows each feature fired on
    total: int = 0


@torch.inference_mode()
def top_activations(sae: SAE, batches: Iterable[torch.Tensor], m: int = 32) -> TopActivations:
    """Stream labelling activations (raw, ``[B, d_in]`` each, in row order) through ``sae``."""
    d = sae.d_sae
    top = TopActivations(torch.zeros(m, d), torch.full((m, d), -1, dtype=torch.long), torch.zeros(d, dtype=torch.long))
    for x in batches:
        acts = sae.encode(x.float())
        top.fired += (acts > 0).sum(0)
        rows = torch.arange(top.total, top.total + x.shape[0]).unsqueeze(1).expand_as(acts)
        values = torch.cat([top.values, acts])
        best = values.topk(m, dim=0)
        top.values = best.values
        top.rows = torch.cat([top.rows, rows]).gather(0, best.indices)
        top.total += x.shape[0]
    return top


def _term(token: str) -> str:
    """A token as a label term: trimmed and lower-cased; whitespace-only tokens shown escaped."""
    stripped = token.strip().lower()
    return stripped if stripped else json.dumps(token)[1:-1] or "<empty>"


def label_terms(weights: dict[str, float], count: int = 3) -> list[str]:
    """The ``count`` heaviest terms, preferring terms with letters; all weights > 0."""
    ranked = [t for t, _ in sorted(weights.items(), key=lambda kv: (-kv[1], kv[0]))]
    is_word = lambda t: any(c.isalpha() for c in t) and not t.startswith("\\")  # not an escaped "\n"
    wordy = [t for t in ranked if is_word(t)]
    others = [t for t in ranked if not is_word(t)]
    return (wordy + others)[:count]


def build_records(top: TopActivations, token_of_row: torch.Tensor, texts: list[str], context_of_row: Any,
                  *, promotes: torch.Tensor | None = None, examples: int = 3, tokens: int = 8) -> list[FeatureRecord]:
    """A record for every feature that fired at least once.

    ``token_of_row[r]`` is the token id at labelling row ``r``; ``texts[id]`` its text;
    ``context_of_row(r)`` the excerpt around it; ``promotes[i]`` the token ids feature ``i`` promotes.
    """
    counts = Counter(token_of_row.tolist())
    n = max(1, len(token_of_row))
    idf = {t: math.log(n / c) + 1.0 for t, c in counts.items()}
    records = []
    for i in torch.nonzero(top.fired > 0).flatten().tolist():
        live = top.values[:, i] > 0
        rows, values = top.rows[live, i].tolist(), top.values[live, i].tolist()
        weights: dict[str, float] = {}
        for r, v in zip(rows, values):
            t = int(token_of_row[r])
            term = _term(texts[t])
            weights[term] = weights.get(term, 0.0) + v * idf.get(t, 1.0)
        terms = label_terms(weights)
        ranked = sorted(weights.items(), key=lambda kv: -kv[1])[:tokens]
        records.append(FeatureRecord(
            index=i, label=", ".join(terms), frequency=round(int(top.fired[i]) / max(1, top.total), 6),
            max_activation=round(values[0], 3) if values else 0.0,
            top_tokens=[(t, round(w, 2)) for t, w in ranked],
            examples=[{"text": context_of_row(r), "activation": round(v, 2)} for r, v in zip(rows, values)][:examples],
            promotes=[] if promotes is None else [texts[t] for t in promotes[i].tolist()]))
    return records


def write_labels(folder: Path, records: list[FeatureRecord]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LABELS_FILE).write_text(json.dumps({str(r.index): r.label for r in records}, indent=0))
    with (folder / FEATURES_FILE).open("w") as f:
        for r in records:
            f.write(json.dumps(asdict(r), ensure_ascii=False) + "\n")


@dataclass(frozen=True)
class Match:
    index: int
    label: str


def _terms(label: str) -> list[str]:
    return [t.strip().lower() for t in label.split(",") if t.strip()]


def _closeness(terms: list[str], q: str) -> int:
    """How closely a label's ``terms`` fit the query ``q``: 0 its first term, 1 any term, 2 a term that starts
    with it, 3 none of these (the query is only a substring)."""
    if terms and terms[0] == q:
        return 0
    if q in terms:
        return 1
    return 2 if any(t.startswith(q) for t in terms) else 3


def rank(labels: Mapping[int, str], query: str, measured: Mapping[int, float] | None = None) -> list[Match]:
    """Every feature whose label contains ``query`` (case-insensitively), best first: labels with it as a
    whole word, then features measured to steer (a held-out measure recommends them a strength; ``measured``
    maps them to their held-out concept rate), then the other substring matches. Within each group measured
    features come first, the higher held-out rate first, then labels whose first term is the
    query, then labels with it as a term, then labels with a term that starts with it ("sporting" for
    "sport", before "transporting"), then by index."""
    measured = measured or {}
    q = query.strip().lower()
    if not q:
        return []
    word = re.compile(rf"(?<!\w){re.escape(q)}(?!\w)")
    keyed = []
    for index, label in labels.items():
        low = label.lower()
        if q not in low:
            continue
        is_measured = index in measured
        group = 0 if word.search(low) else 1 if is_measured else 2
        rate = -measured[index] if is_measured else 1.0
        keyed.append(((group, rate, _closeness(_terms(label), q), index), Match(index, label)))
    return [m for _, m in sorted(keyed, key=lambda km: km[0])]


class LabelIndex:
    """An SAE's feature labels, searchable, and the one rule that turns a name into a feature index.
    ``held`` are the features' held-out measures (``millm.sae.measured``); ``measured`` those recommended a
    strength, with their held-out rates, which :func:`rank` puts first among equal matches."""

    def __init__(self, labels: dict[int, str], name: str = "this SAE", held: Mapping[int, HeldOut] | None = None,
                 ) -> None:
        self.labels = dict(sorted(labels.items()))
        self.name = name
        self.held = dict(held or {})
        self.measured = {i: h.rate for i, h in self.held.items() if h.recommended}

    @classmethod
    def load(cls, folder: Path, name: str | None = None) -> LabelIndex:
        """The index of ``folder/labels.json`` (empty when the SAE has no labels), with the features its
        ``features.jsonl`` marks as measured."""
        labels = read_labels_json(folder)
        if not labels:
            return cls({}, name or Path(folder).name)
        return cls(labels, name or Path(folder).name, held_out_measures(folder))

    def tiers(self, query: str) -> list[list[Match]]:
        """Matches by how closely the label fits: first term equal, any term equal, substring."""
        q = query.strip().lower()
        first, term, substring = [], [], []
        for index, label in self.labels.items():
            terms = _terms(label)
            if terms and terms[0] == q:
                first.append(Match(index, label))
            elif q in terms:
                term.append(Match(index, label))
            elif q in label.lower():
                substring.append(Match(index, label))
        return [first, term, substring]

    def search(self, query: str, limit: int = 50) -> list[Match]:
        """Every feature whose label contains ``query``, best first (:func:`rank`)."""
        return rank(self.labels, query, self.measured)[:limit]

    def rows(self, query: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """``[{"index", "label"}]``: the search's matches, or the first ``limit`` features without a query
        (what ``GET /api/saes/{id}/features?q=`` and ``millm sae features`` list)."""
        if query:
            return [{"index": m.index, "label": m.label} for m in self.search(query, limit)]
        return [{"index": i, "label": label} for i, label in list(self.labels.items())[:limit]]

    def resolve(self, name: str, where: str = "steer") -> int:
        """The one feature ``name`` denotes: an index, or a label search with exactly one best match."""
        text = name.strip().removeprefix("#")
        if (index := index_of(text)) is not None:
            return index
        if not self.labels:
            raise InvalidParameter(f"'{name}' is not a feature index, and {self.name} has no labels to search.",
                                   param=where)
        for tier in self.tiers(text):
            if len(tier) == 1:
                return tier[0].index
            if tier:
                shown = ", ".join(f"{m.index} ({m.label})" for m in tier[:10])
                more = f" and {len(tier) - 10} more" if len(tier) > 10 else ""
                raise InvalidParameter(f"'{name}' is ambiguous on {self.name}: it matches {len(tier)} features: "
                                       f"{shown}{more}. Name one by index, e.g. {tier[0].index}=STRENGTH.",
                                       param=where)
        raise InvalidParameter(f"'{name}' matches no feature label of {self.name}; list labels with "
                               f"`millm sae features {self.name} --search WORD`.", param=where)

    def resolve_assignments(self, items: list[str], where: str = "steer",
                            said: Callable[[str], None] | None = None) -> dict[int, float]:
        """CLI ``weather=60 123=-20`` into ``{index: strength}``, names resolved by :meth:`resolve`. A name without
        ``=STRENGTH`` (``weather``) takes the feature's recommended strength (:meth:`recommended`), and ``said``
        hears which number it used."""
        out: dict[int, float] = {}
        for item in items:
            if "=" not in item and item.strip():
                index = self.resolve(item, where)
                out[index] = self.recommended(index, item, where)
                if said is not None:
                    said(f"{item.strip()}: feature {index} of {self.name} at its recommended strength "
                         f"{out[index]:g} ({self.held[index].describe()})")
                continue
            feature, sep, strength = item.rpartition("=")
            try:
                value = float(strength)
            except ValueError:
                value = float("nan")
            if not sep or not feature.strip() or not math.isfinite(value):
                raise InvalidParameter(f"'{item}' is not FEATURE=STRENGTH or FEATURE (e.g. 123=40, weather=60 or "
                                       "weather for its recommended strength).", param=where)
            out[self.resolve(feature, where)] = value
        return out

    def recommended(self, index: int, name: str, where: str = "steer") -> float:
        """Feature ``index``'s recommended strength (its held-out measure's); else a refusal saying there is none
        and the best held-out point, or that it was never measured so."""
        held = self.held.get(index)
        if held is not None and held.recommended_strength is not None:
            return held.recommended_strength
        give = f"give a strength ({name.strip()}=STRENGTH)"
        if held is None:
            raise InvalidParameter(f"'{name.strip()}' (feature {index} of {self.name}) has no recommended strength: it "
                                   f"was never measured on held-out prompts; {give}, or measure it with `millm steer "
                                   f"sweep {index} --sae {self.name} --save`.", param=where)
        raise InvalidParameter(f"'{name.strip()}' (feature {index} of {self.name}) has no recommended strength: the "
                               f"best held-out point misses the {held.target:.0%} target ({held.describe()}); {give}.",
                               param=where)
