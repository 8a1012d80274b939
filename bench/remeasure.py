"""Re-measure the bundled SAEs with the held-out measure (issue 53): resumable, a few features at a time.

    python bench/remeasure.py --limit 3                         # 3 more features of each bundled SAE
    python bench/remeasure.py --sae smollm2-135m-res-L10        # every feature left on one SAE
    python bench/remeasure.py --features 2375,990 --sae smollm2-135m-res-L10   # these features (measured or not)
    python bench/remeasure.py --summary                         # what the shipped files hold now; measures nothing

What ``millm steer screen --save`` does to a copy of an SAE, done to the shipped files themselves
(``millm/sae/bundled/*/features.jsonl``, which ``--save`` refuses to change): every labelled feature is estimated
(teacher forced), and those whose estimate rises by the screen's floor are swept on the calibration prompts, the
chosen strength verified on the held-out prompts (``millm.research.held_out``), highest estimate first. Each
batch is written as it is measured, so an interrupted run keeps what it did; a feature already measured on the
current prompt set is skipped (run it again to resume), and the estimates (12 minutes an SAE on 2 quiet cores)
are kept in ``MILLM_HOME/remeasure/SAE-PROMPT_SET.estimates.json`` for the next run. When no feature over the
floor is left, the rows' older single-set strengths (``recommended_strength`` without ``held_out``, and
``concept_rate``) are dropped, so the shipped files keep only held-out measures. Prints the time per stage and
per swept feature.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from pathlib import Path

from millm.config import get_settings
from millm.engine import load_engine
from millm.registry import BUNDLED_ID, resolve
from millm.research.measure import HELD_OUT_PROMPTS, NEUTRAL_PROMPTS, SEED, TARGET_RATE, Measure
from millm.research.prompt_sets import PROMPT_SET
from millm.research.saving import Measured, drop_older, save_measured
from millm.research.screen import FLOOR, estimates, screen
from millm.sae.bundled import BundledSAE, bundled_saes
from millm.sae.cards import held_out_measures
from millm.sae.formats import load_sae
from millm.sae.labels import LabelIndex


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sae", action="append", choices=[b.id for b in bundled_saes()],
                        help="a bundled SAE (repeatable; default: all of them)")
    parser.add_argument("--limit", type=int, help="sweep at most this many features per SAE this run")
    parser.add_argument("--features", help="comma-separated indices to measure (again), whatever their estimate")
    parser.add_argument("--prompts", type=int, default=16, help="calibration prompts")
    parser.add_argument("--held-out", type=int, default=len(HELD_OUT_PROMPTS), help="held-out prompts")
    parser.add_argument("--tokens", type=int, default=24, help="tokens per answer (the screen's)")
    parser.add_argument("--summary", action="store_true", help="print what the shipped files hold and stop")
    args = parser.parse_args()
    if args.summary:
        for bundled in bundled_saes():
            if not args.sae or bundled.id in args.sae:
                print(summary(bundled))
        return
    settings = get_settings()
    engine = load_engine(resolve(BUNDLED_ID, settings), settings)
    wanted = {int(f) for f in args.features.split(",")} if args.features else None
    for bundled in bundled_saes():
        if args.sae and bundled.id not in args.sae:
            continue
        engine.steering.attach(bundled.id, load_sae(bundled.path).sae, bundled.layer)
        try:
            remeasure(engine, bundled, args, wanted, settings.home / "remeasure")
        finally:
            engine.steering.detach(bundled.id)


def summary(bundled: BundledSAE) -> str:
    """One bundled SAE's held-out measures on the current prompt set: how many, how many recommended and at which
    strengths, and the mean calibration and held-out rates at the chosen strengths (the winner's curse between)."""
    measured = [h for h in held_out_measures(bundled.path).values() if h.prompt_set == PROMPT_SET]
    chosen = [h for h in measured if h.strength is not None]
    recommended = sorted(s for h in chosen if (s := h.recommended_strength) is not None)
    counts = Counter(recommended)
    spread = ", ".join(f"{s:g}: {n}" for s, n in sorted(counts.items()))
    median = f"; median {statistics.median(recommended):g}" if recommended else ""
    means = (f"; at the chosen strengths calibration {statistics.mean(h.calibration_rate for h in chosen):.1%}, "
             f"held-out {statistics.mean(h.rate for h in chosen):.1%}") if chosen else ""
    return (f"{bundled.id}: {len(measured)} measured on {PROMPT_SET}, {len(recommended)} recommended "
            f"({sum(h.rate >= TARGET_RATE for h in chosen if h.recommended)} with a held-out rate >= "
            f"{TARGET_RATE:.0%}; {spread}{median}){means}")


def remeasure(engine, bundled, args, wanted: set[int] | None, cache: Path) -> None:
    """One bundled SAE: its features left (or ``wanted``) swept and verified, each batch saved as it is done."""
    labels = LabelIndex.load(bundled.path, bundled.id).labels
    done = {i for i, h in held_out_measures(bundled.path).items() if h.prompt_set == PROMPT_SET}
    kept = cache / f"{bundled.id}-{PROMPT_SET}.estimates.json"
    estimated = None
    if wanted is not None:
        labels, done = {i: labels[i] for i in wanted if i in labels}, set()
    elif kept.is_file():
        estimated = {int(k): float(v) for k, v in json.loads(kept.read_text()).items()}
    measure = Measure(engine, NEUTRAL_PROMPTS[:args.prompts], SEED, args.tokens)
    held = Measure(engine, HELD_OUT_PROMPTS[:args.held_out], SEED, args.tokens)
    started, cpu = time.perf_counter(), time.process_time()
    stages: dict[str, float] = {}

    def progress(stage: str, n: int, total: int) -> None:
        stages[stage] = time.perf_counter() - started
        print(f"{bundled.id}: {stage} {n}/{total} ({stages[stage]:.0f} s; {time.process_time() - cpu:.0f} CPU s)",
              flush=True)

    def keep(batch) -> None:
        save_measured(bundled.path, {s.feature: Measured(s.held_out, s.label) for s in batch}, shipped=True)

    if wanted is None and estimated is None:  # kept before any sweep, so an interrupted run keeps them
        estimated = estimates(measure, bundled.id, labels, on_progress=progress)
        cache.mkdir(parents=True, exist_ok=True)
        kept.write_text(json.dumps({str(f): r for f, r in estimated.items()}))
    found = screen(measure, held, bundled.id, labels, floor=-1.0 if wanted is not None else FLOOR,
                   limit=args.limit, skip=done, on_progress=progress, on_swept=keep, estimated=estimated)
    over = [f for f, rise in found.estimates.items() if rise >= FLOOR]
    swept_s = time.perf_counter() - started - stages.get("estimate", 0.0)
    left = len(set(over) - done - {s.feature for s in found.swept})
    print(f"{bundled.id}: {len(found.estimates)} estimated in {stages.get('estimate', 0.0):.0f} s, {len(over)} over "
          f"the floor {FLOOR}; swept {len(found.swept)} in {swept_s:.0f} s "
          f"({swept_s / max(1, len(found.swept)):.0f} s a feature), {len(found.steers)} recommended; "
          f"{left} left", flush=True)
    if wanted is None and left == 0:
        dropped = drop_older(bundled.path, shipped=True)
        print(f"{bundled.id}: every feature over the floor measured; older single-set strengths dropped from "
              f"{dropped} rows", flush=True)


if __name__ == "__main__":
    main()
