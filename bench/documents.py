"""The example cluster and circuit in profiles/: how often answers mention their concept at each λ, and the
fluency it costs.

    python bench/documents.py                                  # the figures: 20 prompts, 48 tokens
    python bench/documents.py --prompts 4 --tokens 24          # a quick look
    python bench/documents.py --doc profiles/my-cluster.json   # another document of the bundled SAEs

For each document and each λ in LAMBDAS (as serving resolves a request's ``steering_intensity``: within
the document's declared ``intensity_range``), the authored strengths are scaled as serving scales them
(``millm.steering.intensity.scale``: strength × λ, each clamped to ±200) and the answers are measured with
``millm.research`` (seeded answers to the neutral prompts sampled as chat requests on the engine, the
concept rate over the document's ``concept`` words, fluency against the unsteered answers, bound -1.5
nats/token). Both bundled
SAEs are attached (layers 10 and 20), so a circuit serves natively. For comparison, each member feature is
also measured alone at its authored strength × the best λ. Nothing is registered or persisted.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from millm.config import get_settings
from millm.engine import load_engine
from millm.registry import BUNDLED_ID, resolve
from millm.research.measure import FLUENCY_BOUND, MAX_NEW_TOKENS, NEUTRAL_PROMPTS, SEED, TARGET_RATE, Case, Measure
from millm.research.words import concept_rate
from millm.sae.bundled import bundled_saes
from millm.sae.formats import load_sae
from millm.steering.intensity import BaseKind, IntensitySettings, resolve_lambda, scale

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = (ROOT / "profiles" / "weather-cluster.json", ROOT / "profiles" / "weather-circuit.json")
LAMBDAS = (0.5, 1.0, 1.5, 2.0)
# the words that count as each example's concept (mentions: whole words or their plurals, any case)
WEATHER = ("weather", "rain", "rainy", "snow", "snowy", "storm", "forecast", "sunny", "cloud", "cloudy", "wind",
           "windy", "hurricane", "thunder", "frozen", "ice", "icy", "fog")
CONCEPT_WORDS = {"weather-cluster": WEATHER, "weather-circuit": WEATHER}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=len(NEUTRAL_PROMPTS), help="first N neutral prompts")
    parser.add_argument("--tokens", type=int, default=MAX_NEW_TOKENS, help="tokens per answer")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--doc", type=Path, action="append", help="a cluster or circuit document (repeatable)")
    parser.add_argument("--concept", action="append", help="a concept word for --doc (repeatable; default: "
                                                           "the example's own list)")
    args = parser.parse_args()
    settings = get_settings()
    intensity = IntensitySettings.from_settings(settings)
    engine = load_engine(resolve(BUNDLED_ID, settings), settings)
    control = engine.steering_target().steering
    by_layer = {}
    for bundled in bundled_saes():
        control.attach(bundled.id, load_sae(bundled.path).sae, bundled.layer)
        by_layer[bundled.layer] = bundled.id
    started = time.perf_counter()
    measure = Measure(engine, NEUTRAL_PROMPTS[:args.prompts], args.seed, args.tokens)
    print(f"{len(measure.prompts)} prompts, {args.tokens} tokens, seed {args.seed}; unsteered log-prob "
          f"{measure.plain_logprob:.3f}; target >= {TARGET_RATE:.0%} inside -{FLUENCY_BOUND:g} nats/token")
    try:
        for path in args.doc or DOCUMENTS:
            doc = json.loads(path.read_text())
            words = tuple(args.concept or CONCEPT_WORDS[doc["name"]])
            layer_of = doc["sae"]["layer"] if doc["kind"] == "cluster" else None
            strengths: dict[str, dict[int, float]] = {}
            for m in doc["members"]:
                strengths.setdefault(by_layer[m.get("layer", layer_of)], {})[m["feature"]] = m["strength"]
            kind = BaseKind.CLUSTER if doc["kind"] == "cluster" else BaseKind.CIRCUIT
            declared = tuple(doc["intensity_range"]) if doc.get("intensity_range") else None
            lambdas = sorted({resolve_lambda(lam, kind, declared, 1.0, intensity) for lam in LAMBDAS})
            cases = [Case(lam, scale(strengths, lam), words) for lam in lambdas]
            points = measure.points(cases)
            print(f"{doc['name']} ({doc['kind']}, {len(doc['members'])} members; concept words "
                  f"{', '.join(words)}; unsteered rate {concept_rate(measure.plain, words):.0%}):")
            for p in points:
                mark = "inside" if p.inside else f"past -{FLUENCY_BOUND:g}"
                print(f"  λ {p.strength:g}: rate {p.rate:.0%}, fluency {p.fluency:+.2f} ({mark})  e.g. "
                      f"{p.example[:70]!r}")
            fit = [p for p in points if p.inside]
            best = max(fit, key=lambda p: p.rate).strength if fit else 1.0
            alone = [Case(best, {sae: {f: s * best}}, words) for sae, values in strengths.items()
                     for f, s in values.items()]
            for case, p in zip(alone, measure.points(alone)):
                ((sae, values),) = case.values.items()
                ((feature, strength),) = values.items()
                print(f"  alone: {sae} feature {feature} at {strength:g}: rate {p.rate:.0%}, fluency "
                      f"{p.fluency:+.2f}")
    finally:
        control.detach_all()
    print(f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
