"""Steering methods compared on bench/sweep.py's ten concepts, under one measure (``millm.research.measure``:
concept rate, prompt-free fluency, relevance, degeneration).

    python bench/steer_methods.py                        # the table: 8 prompts, 32 tokens, 32 + 32 examples
    python bench/steer_methods.py --concept dog --prompts 4 --tokens 16 --examples 8   # a quick check
    python bench/steer_methods.py --out methods.png      # and a plot

Per concept, each method at its recommended strength (the lowest reaching 60% inside the fluency bound,
else the best inside it; the sweep's rule):
- ``sae``: the top label-search hit of the bundled L10 SAE, swept at STRENGTHS (as ``bench/sweep.py`` with no
  stored strength: every method is swept the same way);
- ``diffmean`` and ``pca``: a vector learned at layer 10 from the model's own answers about the concept
  (``--examples`` of each side, ``millm.vectors.learn``), swept at STRENGTHS;
- ``prompt``: no steering; a system message asks to mention the concept.
Printed per method and concept: strength, concept rate, fluency and relevance (nats/token against the
unsteered answers), and the old prompt-conditioned fluency; last, per method, how many of the concepts
reach >= 60% inside the bound. Everything runs on one loaded model in this process; nothing is stored.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from millm.config import get_settings
from millm.engine import load_engine
from millm.registry import BUNDLED_ID, resolve
from millm.research.measure import FLUENCY_BOUND, NEUTRAL_PROMPTS, SEED, TARGET_RATE, Measure, Point
from millm.research.sweep import run_sweep
from millm.sae.bundled import bundled_saes
from millm.sae.formats import load_sae
from millm.sae.labels import LabelIndex
from millm.vectors.learn import generated, learn

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

    @property
    def reached(self) -> bool:
        return self.point is not None and self.point.rate >= TARGET_RATE and self.point.inside


def swept(measure: Measure, sae_id: str, feature: int, label: str, concept: str) -> Point | None:
    result = run_sweep(measure, sae_id, LAYER, feature, label, (concept,), STRENGTHS)
    return result.point(result.recommended) if result.recommended is not None else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8, help="first N neutral prompts")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per answer")
    parser.add_argument("--examples", type=int, default=32, help="generated examples of each side per vector")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--concept", action="append", choices=CONCEPTS, help="only this concept (repeatable)")
    parser.add_argument("--out", help="write a PNG plot of the concept rates here")
    args = parser.parse_args()
    concepts = [c for c in CONCEPTS if not args.concept or c in args.concept]
    settings = get_settings()
    engine = load_engine(resolve(BUNDLED_ID, settings), settings)
    bundled = next(b for b in bundled_saes() if b.id == SAE)
    index = LabelIndex.load(bundled.path, bundled.id)
    steering = engine.steering
    steering.attach(bundled.id, load_sae(bundled.path).sae, LAYER)
    measure = Measure(engine, NEUTRAL_PROMPTS[:args.prompts], args.seed, args.tokens)
    started = time.perf_counter()
    print(f"{len(measure.prompts)} prompts, {args.tokens} tokens, {args.examples} + {args.examples} examples, "
          f"layer {LAYER}, strengths {', '.join(f'{s:g}' for s in STRENGTHS)}; unsteered log-prob without the "
          f"prompt {measure.plain_logprob:.3f}, with it {measure.plain_scored.prompted:.3f}", flush=True)
    rows: list[Row] = []
    try:
        for concept in concepts:
            hits = index.search(concept, 1)
            if hits:
                rows.append(Row("sae", concept, swept(measure, bundled.id, hits[0].index, hits[0].label, concept),
                                f"feature {hits[0].index} ({hits[0].label})"))
            else:
                rows.append(Row("sae", concept, None, "no label contains it"))
            examples = generated(engine, [concept], args.examples, args.seed + 1000)
            for method in ("diffmean", "pca"):
                name = f"{method}-{concept}"
                vs = learn(engine, [name], LAYER, examples, method=method)
                steering.attach(name, vs.as_sae(), LAYER)
                try:
                    rows.append(Row(method, concept, swept(measure, name, 0, name, concept)))
                finally:
                    steering.detach(name)
            answers = measure.answers_with(SYSTEM.format(concept))
            rows.append(Row("prompt", concept, measure.judge(answers, (concept,)), f'system: "{SYSTEM}"'))
            for row in rows[-len(METHODS):]:
                print(line(row), flush=True)
    finally:
        steering.detach_all()
    print(f"reaching >= {TARGET_RATE:.0%} inside -{FLUENCY_BOUND:g} nats/token, of {len(concepts)}: "
          + ", ".join(f"{m} {sum(r.reached for r in rows if r.method == m)}" for m in METHODS)
          + f"; {time.perf_counter() - started:.0f} s")
    if args.out:
        plot(rows, args.out)


def line(row: Row) -> str:
    p = row.point
    if p is None:
        return f"  {row.concept:8} {row.method:8} no strength mentions it inside the bound {row.note}"
    return (f"  {row.concept:8} {row.method:8} strength {p.strength:>5g}: rate {p.rate:4.0%}, fluency "
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
