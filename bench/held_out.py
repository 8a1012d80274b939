"""Does a stored held-out rate hold on prompts that neither chose nor verified it? (issue 53's Measure)

    python bench/held_out.py                          # 20 features of the bundled SAEs, and every calibrated vector set
    python bench/held_out.py --limit 3 --no-vectors   # a quick check

For each feature with a recommended strength in a bundled SAE's ``features.jsonl`` (a seeded random sample,
``--limit`` in all, default 20, taken from the SAEs in turn; not the highest held-out rates, whose fresh rates
would fall back towards the mean by the choice alone) and each registered vector set whose
vectors carry a held-out measure (``millm vectors calibrate``; ``--no-vectors`` leaves them out), the stored
strength is measured again on the shipped ``fresh`` prompts (``millm.research.prompt_sets``: 16 prompts in
neither the calibration nor the held-out set), seeded and sampled as a request is, with the stored measure's
tokens and seed, and the fresh rate is compared with the stored held-out rate's 90% interval. Printed per
feature: stored rate and interval, fresh rate, inside or not; last, how many fall inside (the issue's target:
at least 17 of 20 features and 9 of 10 vectors).

Each fresh prompt is answered ``--samples`` times (default 4; the first draw seeded as the stored measure seeds
its prompts, the others with the seeds after them), so the fresh rate is the rate on those 16 prompts rather than
one draw of it: a stored rate of 16 answers and a fresh rate of 16 more land in the same 90% interval only about
three times in four even when both measure the same thing (each is off by its own binomial noise), against
about 0.86 with 64 fresh answers. Both counts are printed: the first draw alone and all of them.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from millm.config import get_settings
from millm.engine import load_engine
from millm.registry import BUNDLED_ID, resolve
from millm.research.measure import Case, Measure
from millm.research.prompt_sets import prompt_set
from millm.research.words import label_words
from millm.sae.bundled import bundled_saes
from millm.sae.cards import held_out_measures
from millm.sae.formats import load_sae
from millm.sae.labels import LabelIndex
from millm.sae.measured import HeldOut
from millm.sae.vector_sets import read_meta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=20, help="bundled features measured, in all")
    parser.add_argument("--no-vectors", action="store_true", help="leave the vector sets out")
    parser.add_argument("--samples", type=int, default=4, help="answers to each fresh prompt")
    parser.add_argument("--seed", type=int, default=0, help="the sample of recommended features")
    args = parser.parse_args()
    if args.samples < 1:
        parser.error(f"--samples must be at least 1, not {args.samples}")
    settings = get_settings()
    engine = load_engine(resolve(BUNDLED_ID, settings), settings)
    fresh = prompt_set().fresh
    started = time.perf_counter()
    chosen = features(args.limit, args.seed)
    marks = [check(engine, sae_id, path, layer, found, fresh, args.samples) for sae_id, path, layer, found in chosen]
    summary("features", [m for per_sae in marks for m in per_sae], args.samples)
    if not args.no_vectors:
        sets = [check(engine, name, path, layer, found, fresh, args.samples)
                for name, path, layer, found in vector_sets()]
        summary("vectors", [m for per_set in sets for m in per_set], args.samples)
    print(f"{time.perf_counter() - started:.0f} s")


def summary(what: str, marks: list[tuple[bool, bool]], samples: int) -> None:
    """How many fresh rates fall inside the stored interval: the first draw's alone, and all draws'."""
    print(f"{what}: {sum(all_ for _, all_ in marks)} of {len(marks)} fresh rates inside the stored 90% interval "
          f"({samples} answers a prompt); the first answer alone: {sum(first for first, _ in marks)} of {len(marks)}",
          flush=True)


Found = list[tuple[int, HeldOut, tuple[str, ...]]]


def features(limit: int, seed: int) -> list[tuple[str, Path, int, Found]]:
    """Up to ``limit`` recommended features of the bundled SAEs, taken from each SAE in turn, each SAE's in a
    seeded random order."""
    per_sae = []
    for bundled in bundled_saes():
        labels = LabelIndex.load(bundled.path, bundled.id).labels
        held = sorted((i, h) for i, h in held_out_measures(bundled.path).items() if h.recommended)
        random.Random(seed).shuffle(held)
        per_sae.append((bundled, [(i, h, label_words(labels.get(i, ""))) for i, h in held]))
    taken: dict[str, Found] = {b.id: [] for b, _ in per_sae}
    for k in range(max((len(found) for _, found in per_sae), default=0)):
        for bundled, found in per_sae:
            if k < len(found) and sum(map(len, taken.values())) < limit:
                taken[bundled.id].append(found[k])
    return [(b.id, b.path, b.layer, taken[b.id]) for b, _ in per_sae if taken[b.id]]


def vector_sets() -> list[tuple[str, Path, int, Found]]:
    """The registered vector sets whose vectors carry a held-out measure, recommended or not (the stored rate is the
    claim either way: a vector with none recommended stores its best held-out point)."""
    from millm.local import steering_service

    service = steering_service()
    out = []
    for record in service.store.saes():
        if record["format"] != "vectors":
            continue
        path = Path(record["path"])
        words = tuple(str(c).lower() for c in read_meta(path).get("source", {}).get("concepts") or [])
        found = [(i, h, words) for i, h in held_out_measures(path).items() if h.strength is not None]
        if found and words:
            out.append((str(record["id"]), path, int(record["layer_hint"]), found))
    return out


def check(engine, sae_id: str, path: Path, layer: int, found: Found, fresh: tuple[str, ...],
          samples: int) -> list[tuple[bool, bool]]:
    """Each stored strength measured on the fresh prompts, ``samples`` answers a prompt (draw ``k`` seeds prompt
    ``i`` with ``seed + k * len(fresh) + i``); whether the first draw's rate, and all draws' rate, is inside the
    stored interval."""
    engine.steering.attach(sae_id, load_sae(path).sae, layer)
    marks = []
    try:
        by_size: dict[tuple[int, int], Found] = {}
        for item in found:
            by_size.setdefault((item[1].tokens, item[1].seed), []).append(item)
        for (tokens, seed), items in by_size.items():
            cases = [Case.feature(sae_id, i, h.strength or 0.0, words) for i, h, words in items]
            draws = [Measure(engine, fresh, seed + k * len(fresh), tokens).points(cases) for k in range(samples)]
            for n, (i, h, _) in enumerate(items):
                rates = [points[n].rate for points in draws]
                first, rate = rates[0], sum(rates) / len(rates)
                marks.append((h.low <= first <= h.high, h.low <= rate <= h.high))
                print(f"{sae_id} #{i} at {h.strength:g}: stored {h.rate:.0%} [{h.low:.0%}-{h.high:.0%}], fresh "
                      f"{rate:.0%} ({len(fresh)} prompts x {samples}, {tokens} tokens; the first draw {first:.0%}): "
                      f"{'inside' if marks[-1][1] else 'OUTSIDE'}", flush=True)
    finally:
        engine.steering.detach(sae_id)
    return marks


if __name__ == "__main__":
    main()
