"""Strength sweeps for ten everyday concepts on a bundled SAE: how many reach the steering target.

    python bench/sweep.py                                   # the figures: 20 prompts, 48 tokens
    python bench/sweep.py --sae smollm2-135m-res-L20        # the same on another bundled SAE
    python bench/sweep.py --prompts 2 --tokens 16 --concept rain --concept dog   # a quick check

For each concept in CONCEPTS (fixed before any result was seen), the top label-search hit on the SAE
``--sae`` names (default SAE; ``LabelIndex.search``, what ``millm sae features --search`` lists first:
whole-word matches, measured features first) is measured at its recommended strength (the one ``millm steer screen``
stored in the bundled features.jsonl; a hit without one is swept at STRENGTHS and gets the sweep's), with
``millm.research`` (the measures of ``millm steer sweep`` and bench/sae_quality.py: seeded answers to the
neutral prompts sampled as chat requests on the engine, fluency against the unsteered answers, bound -1.5
nats/token), the concept
rate counting the concept itself (its singular and plural), not the hit's other label terms ("county" on
a "city, francisco, county" feature is not a mention of a city). Printed per concept: the feature, its
label, the strength and the rate and fluency there; last, how many of the ten reach >= 60% inside the
fluency bound. The SAE is attached to the loaded model for the run only; nothing is registered or persisted.
"""

from __future__ import annotations

import argparse
import time

from millm.config import get_settings
from millm.engine import load_engine
from millm.registry import BUNDLED_ID, resolve
from millm.research.measure import (
    FLUENCY_BOUND,
    HELD_OUT_PROMPTS,
    MAX_NEW_TOKENS,
    NEUTRAL_PROMPTS,
    SEED,
    TARGET_RATE,
    Measure,
)
from millm.research.sweep import run_sweep
from millm.sae.bundled import bundled_saes
from millm.sae.cards import read_card
from millm.sae.formats import load_sae
from millm.sae.labels import LabelIndex

SAE = "smollm2-135m-res-L10"
# ten everyday concepts, none of bench/sae_quality.py's (music, ocean, weather, trees, waves, ship, planet,
# dreams, fire), written down before any sweep was run
CONCEPTS = ("rain", "dog", "food", "money", "car", "city", "winter", "book", "sport", "garden")
STRENGTHS = (20.0, 40.0, 60.0, 80.0, 100.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=len(NEUTRAL_PROMPTS), help="first N neutral prompts")
    parser.add_argument("--tokens", type=int, default=MAX_NEW_TOKENS, help="tokens per answer")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--sae", default=SAE, choices=[b.id for b in bundled_saes()], help="the bundled SAE")
    parser.add_argument("--concept", action="append", choices=CONCEPTS,
                        help="only this concept of the list (repeatable; a quick check, not the figure)")
    args = parser.parse_args()
    concepts = [c for c in CONCEPTS if not args.concept or c in args.concept]
    settings = get_settings()
    engine = load_engine(resolve(BUNDLED_ID, settings), settings)
    bundled = next(b for b in bundled_saes() if b.id == args.sae)
    index = LabelIndex.load(bundled.path, bundled.id)
    control = engine.steering
    started = time.perf_counter()
    sae = load_sae(bundled.path).sae
    control.attach(bundled.id, sae, bundled.layer)
    measure = Measure(engine, NEUTRAL_PROMPTS[:args.prompts], args.seed, args.tokens)
    held = Measure(engine, HELD_OUT_PROMPTS, args.seed, args.tokens)
    print(f"{bundled.id} (layer {bundled.layer}): {len(measure.prompts)} prompts, {args.tokens} tokens, "
          f"seed {args.seed}, strengths {', '.join(f'{s:g}' for s in STRENGTHS)}")
    reached = 0
    try:
        for concept in concepts:
            hits = index.search(concept, 1)
            if not hits:
                print(f"  {concept}: no feature label contains it")
                continue
            hit = hits[0]
            stored = read_card(bundled.path, hit.index, sae.d_sae, name=bundled.id).recommended_strength
            strengths = (stored,) if stored is not None else STRENGTHS
            result = run_sweep(measure, held, bundled.id, bundled.layer, hit.index, hit.label, (concept,), strengths)
            source = "stored" if stored is not None else "swept"
            best = result.point(stored if stored is not None else result.chosen)
            rates = " ".join(f"{p.strength:g}:{p.rate:.0%}/{p.fluency:+.2f}" for p in result.points)
            if best is None:
                print(f"  {concept}: feature {hit.index} ({hit.label}): no recommended strength "
                      f"(unsteered {result.unsteered_rate:.0%}; {rates})")
                continue
            ok = best.rate >= TARGET_RATE and best.inside
            reached += ok
            print(f"  {concept}: feature {hit.index} ({hit.label}): {source} strength {best.strength:g}: "
                  f"rate {best.rate:.0%} (unsteered {result.unsteered_rate:.0%}), fluency {best.fluency:+.2f}"
                  f"{'' if ok else ' (below the target)'}" + ("" if stored is not None else f"; swept: {rates}"))
    finally:
        control.detach_all()
    print(f"unsteered log-prob {measure.plain_logprob:.3f} (the unsteered answers ride in the first concept's job)")
    print(f"{reached} of {len(concepts)} reach >= {TARGET_RATE:.0%} inside the fluency bound (-{FLUENCY_BOUND:g} "
          f"nats/token); {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
