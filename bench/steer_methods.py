"""Steering methods compared on bench/sweep.py's ten concepts, under one measure (``millm.research.measure``:
concept rate, prompt-free fluency, relevance, degeneration).

    python bench/steer_methods.py                        # the table: 10 prompts, 48 tokens, 128 + 128 examples
    python bench/steer_methods.py --concept dog --prompts 4 --tokens 16 --examples 8   # a quick check
    python bench/steer_methods.py --method diffmean --layer 10 --layer 14 --scope all --scope generated
    python bench/steer_methods.py --out methods.png      # and a plot
    python bench/steer_methods.py --method diffmean --layer 10 --layer 14 --layer 18 --together

Per concept, each method at its recommended strength (the lowest reaching 60% inside the fluency bound,
else the best inside it; the sweep's rule):
- ``sae``: the top label-search hit of the bundled L10 SAE, swept at STRENGTHS (as ``bench/sweep.py`` with no
  stored strength: every method is swept the same way);
- ``diffmean`` and ``pca``: a vector learned at each ``--layer`` (default 10) from the model's own answers about
  the concept against its answers about other topics (``--negatives``; ``--examples`` of each side,
  ``millm.vectors.learn``, as ``millm vectors learn`` makes it), swept at STRENGTHS;
- ``prompt``: no steering; a system message asks to mention the concept.
With ``--together``, each vector method is measured with every ``--layer``'s vector steered at once instead of
one by one, a strength s adding s / (number of layers) times each (so s is the total added, as one layer's s is).
Printed per method and concept: strength, concept rate, fluency and relevance (nats/token against the
unsteered answers), and the old prompt-conditioned fluency; last, per method, how many of the concepts
reach >= 60% inside the bound, per layer and ``--scope`` (where steering applies: ``all`` or ``generated``).
Everything runs on one loaded model in this process; nothing is stored.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from millm.config import get_settings
from millm.engine import load_engine
from millm.registry import BUNDLED_ID, resolve
from millm.research.measure import (
    FLUENCY_BOUND,
    MAX_NEW_TOKENS,
    NEUTRAL_PROMPTS,
    SEED,
    TARGET_RATE,
    Case,
    Measure,
    Point,
)
from millm.research.sweep import recommend, swept_points
from millm.sae.bundled import bundled_saes
from millm.sae.formats import load_sae
from millm.sae.labels import LabelIndex
from millm.steering.scope import SCOPES
from millm.vectors import EXAMPLES
from millm.vectors.learn import NEGATIVES, generated, learn

SAE = "smollm2-135m-res-L10"
LAYER = 10
CONCEPTS = ("rain", "dog", "food", "money", "car", "city", "winter", "book", "sport", "garden")  # bench/sweep.py's
STRENGTHS = (20.0, 40.0, 60.0, 80.0, 100.0)
METHODS = ("sae", "diffmean", "pca", "prompt")
SYSTEM = "In your answer, talk about {}."


@dataclass
class Row:
    method: str
    concept: str
    point: Point | None
    note: str = ""
    layer: int | str = LAYER  # a layer, or "10+14+18" for vectors steered together
    scope: str = "all"

    @property
    def key(self) -> str:
        return self.method + ("" if self.method == "prompt" else f" L{self.layer} {self.scope}")

    @property
    def reached(self) -> bool:
        return self.point is not None and self.point.rate >= TARGET_RATE and self.point.inside


def swept(measure: Measure, sae_id: str, layer: int, feature: int, concept: str) -> Point | None:
    """The point the calibration sweep chooses (:func:`recommend`; this bench compares methods on one prompt set)."""
    [points] = swept_points(measure, [lambda s: Case.feature(sae_id, feature, s, (concept,))], STRENGTHS)
    best = recommend(points, bound=measure.bound)
    return next((p for p in points if p.strength == best), None) if best is not None else None


def together(measure: Measure, names: list[str], concept: str) -> Point | None:
    """The vectors ``names`` (one per layer, attached) steered at once, s / len(names) each."""
    def case(strength: float) -> Case:
        share = strength / len(names)
        return Case(strength, {name: {0: share} for name in names} if strength else {}, (concept,))

    [points] = swept_points(measure, [case], STRENGTHS)
    best = recommend(points, bound=measure.bound)
    return next((p for p in points if p.strength == best), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=10, help="first N neutral prompts")
    parser.add_argument("--tokens", type=int, default=MAX_NEW_TOKENS, help="tokens per answer")
    parser.add_argument("--examples", type=int, default=EXAMPLES, help="generated examples of each side per vector")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--concept", action="append", choices=CONCEPTS, help="only this concept (repeatable)")
    parser.add_argument("--method", action="append", choices=METHODS, help="only this method (repeatable)")
    parser.add_argument("--layer", action="append", type=int, help=f"vector layer (repeatable; default {LAYER})")
    parser.add_argument("--scope", action="append", choices=SCOPES, help="where steering applies (repeatable; "
                        "default all)")
    parser.add_argument("--together", action="store_true", help="steer every --layer's vector at once")
    parser.add_argument("--negatives", choices=NEGATIVES, default="topics", help="the vectors' negative examples")
    parser.add_argument("--out", help="write a PNG plot of the concept rates here")
    args = parser.parse_args()
    concepts = [c for c in CONCEPTS if not args.concept or c in args.concept]
    methods = [m for m in METHODS if not args.method or m in args.method]
    layers, scopes = args.layer or [LAYER], args.scope or ["all"]
    settings = get_settings()
    engine = load_engine(resolve(BUNDLED_ID, settings), settings)
    bundled = next(b for b in bundled_saes() if b.id == SAE)
    index = LabelIndex.load(bundled.path, bundled.id)
    steering = engine.steering
    steering.attach(bundled.id, load_sae(bundled.path).sae, LAYER)
    measures = {scope: Measure(engine, NEUTRAL_PROMPTS[:args.prompts], args.seed, args.tokens, scope=scope)
                for scope in scopes}
    measure = measures[scopes[0]]
    started = time.perf_counter()
    print(f"{len(measure.prompts)} prompts, {args.tokens} tokens, {args.examples} + {args.examples} examples "
          f"({args.negatives} negatives), layers {', '.join(map(str, layers))}, scopes {', '.join(scopes)}, "
          f"strengths {', '.join(f'{s:g}' for s in STRENGTHS)}; unsteered log-prob without the prompt "
          f"{measure.plain_logprob:.3f}, with it {measure.plain_scored.prompted:.3f}", flush=True)
    rows: list[Row] = []
    try:
        for concept in concepts:
            done = len(rows)
            if "sae" in methods:
                hits = index.search(concept, 1)
                for scope in scopes:
                    point = (swept(measures[scope], bundled.id, LAYER, hits[0].index, concept) if hits else None)
                    note = f"feature {hits[0].index} ({hits[0].label})" if hits else "no label contains it"
                    rows.append(Row("sae", concept, point, note, LAYER, scope))
            vectors = [m for m in ("diffmean", "pca") if m in methods]
            if vectors:
                examples = generated(engine, [concept], args.examples, args.seed + 1000, negatives=args.negatives)
            for method in vectors:
                sets = learn(engine, f"{method}-{concept}", layers, examples, method=method)
                try:
                    for vs in sets:
                        steering.attach(vs.names[0], vs.as_sae(), vs.layer)
                        if not args.together:
                            rows.extend(Row(method, concept, swept(measures[scope], vs.names[0], vs.layer, 0,
                                                                   concept), "", vs.layer, scope) for scope in scopes)
                    if args.together:
                        names, joined = [vs.names[0] for vs in sets], "+".join(str(vs.layer) for vs in sets)
                        rows.extend(Row(method, concept, together(measures[scope], names, concept), "", joined,
                                        scope) for scope in scopes)
                finally:
                    for vs in sets:
                        if vs.names[0] in steering.attachments:
                            steering.detach(vs.names[0])
            if "prompt" in methods:
                answers = measure.answers_with(SYSTEM.format(concept))
                rows.append(Row("prompt", concept, measure.judge(answers, (concept,)), f'system: "{SYSTEM}"'))
            for row in rows[done:]:
                print(line(row), flush=True)
    finally:
        steering.detach_all()
    keys = list(dict.fromkeys(r.key for r in rows))
    print(f"reaching >= {TARGET_RATE:.0%} inside -{FLUENCY_BOUND:g} nats/token, of {len(concepts)}: "
          + ", ".join(f"{k} {sum(r.reached for r in rows if r.key == k)}" for k in keys)
          + f"; {time.perf_counter() - started:.0f} s")
    if args.out:
        plot(rows, args.out)


def line(row: Row) -> str:
    p = row.point
    if p is None:
        return f"  {row.concept:8} {row.key:22} no strength mentions it inside the bound {row.note}"
    return (f"  {row.concept:8} {row.key:22} strength {p.strength:>5g}: rate {p.rate:4.0%}, fluency "
            f"{p.fluency:+.2f}, relevance {p.relevance:+.2f}, prompted {p.prompted:+.2f}, degenerate "
            f"{p.degenerate:.0%}{'' if row.reached else ' (below the target)'} {row.note}")


def plot(rows: list[Row], out: str) -> None:
    """A bar per concept and method (in METHODS order within each concept): its concept rate, green inside the
    fluency bound, red past it (a method with no strength inside is an empty bar)."""
    from millm.research.plots import write_png

    empty = Point(0.0, 0.0, 0.0, 0.0, False)
    print(f"wrote {write_png(out, [r.point or empty for r in rows])}")


if __name__ == "__main__":
    main()
