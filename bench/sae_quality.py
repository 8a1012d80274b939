"""Quality of the bundled SAEs, measured on held-out text, printed figure by figure.

    python bench/sae_quality.py [--sae smollm2-135m-res-L10 ...] [--ce-windows 24] [--skip-steering]
    python bench/sae_quality.py --sae my-l10 --concept rain=60    # any registered SAE (id or name) or a folder
    python bench/sae_quality.py --sae smollm2-135m-res-L10 --skip-reconstruction --concept rain=60 --prompts 10

``--concept NAME=S`` (repeatable) measures those features instead of the documented list (to choose
concepts and strengths); ``--prompts N`` uses the first N neutral prompts (the figures need all 20).

For each SAE, on the held-out tenth of the corpus its train.json names (documents never trained on; the
same seeded split ``millm sae train`` made):
- FVU: fraction of variance unexplained at k=32 (target <= 0.15), every position but each window's first;
- CE: the model's next-token loss clean, with the SAE's reconstruction spliced in at its layer, and with
  that layer's output zeroed (same positions); the SAE's share of the zero-ablation gap (target <= 10%);
- dead: features that never fire on any held-out token (target <= 5%);
- steering: for each concept feature in CONCEPTS (resolved by label, as ``--steer NAME=S`` does), 20
  seeded sampled answers to 20 neutral prompts, steered at the documented strength and unsteered: the
  share that mention the concept (one of the feature's top tokens that is a word, from its features.jsonl
  row) (targets >= 60% steered, <= 10% unsteered), and fluency: the steered answers' mean token
  log-probability under the unsteered model, minus the unsteered answers' own (bound: >= -FLUENCY_BOUND
  nats/token). The prompts, the sampling and both measures are ``millm.research``'s, which
  ``millm steer sweep`` and bench/sweep.py use too;
- throughput: training steps/s and tokens/s at this SAE's width on this machine now, beside the wall
  time its one documented command took (from its train.json).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from millm.config import get_settings
from millm.engine import load_engine
from millm.engine.transformers_engine import TransformersEngine
from millm.registry import BUNDLED_ID, resolve
from millm.research.answers import sample_answers
from millm.research.measure import FLUENCY_BOUND, MAX_NEW_TOKENS, NEUTRAL_PROMPTS, SEED, Measure
from millm.research.words import concept_rate, top_token_words
from millm.sae import activations
from millm.sae.bundled import bundled_saes
from millm.sae.cards import feature_rows
from millm.sae.formats import load_sae
from millm.sae.labels import LabelIndex
from millm.sae.model import SAE
from millm.sae.training import corpus, quality, recipe
from millm.sae.training.train import ShuffledBatches, TopKTrainer, TrainConfig

# per SAE: (label name, resolved on its labels as --steer NAME=S is, or an index where the name is ambiguous:
# 1604 'weather, forecast, hurricane', 436 'dreams, dream, dreamed'; and the documented strength)
CONCEPTS: dict[str, list[tuple[str, float]]] = {
    "smollm2-135m-res-L10": [("music", 40.0), ("ocean", 60.0), ("1604", 60.0), ("trees", 50.0), ("waves", 50.0)],
    "smollm2-135m-res-L20": [("ship", 60.0), ("ocean", 80.0), ("planet", 80.0), ("436", 60.0), ("fire", 80.0)],
}


def run_spec(model_id: str, folder: Path) -> recipe.RunSpec:
    """The corpus the SAE was trained on, as its train.json records it (else the default corpus), so that
    its held-out tenth is text it never saw."""
    train_json = folder / "train.json"
    spec = json.loads(train_json.read_text())["spec"] if train_json.is_file() else {}
    if not spec:
        print("  no train.json: reconstruction is measured on the default corpus's held-out tenth")
    return recipe.RunSpec(model_id=model_id, layer=0, output=Path("."), context=spec.get("context", 256),
                          seed=spec.get("seed", 0), corpus_paths=tuple(Path(p) for p in spec.get("corpus_paths", ())),
                          generated_documents=spec.get("generated_documents", 256),
                          holdout_fraction=spec.get("holdout_fraction", 0.1))


def held_out(engine: TransformersEngine, settings: Any, spec: recipe.RunSpec) -> torch.Tensor:
    answer = lambda prompts, seed, tokens: sample_answers(engine, prompts, seed, tokens)[0]  # noqa: E731
    _, held = recipe.documents(spec, answer, engine.tokenizer, settings.cache_dir)
    return corpus.token_windows(engine.tokenizer, held, spec.context)


def chosen_saes(refs: list[str] | None) -> list[tuple[str, Path, int, str]]:
    """(id, folder, layer, model id) of each SAE to measure: the bundled ones by default, else each ``--sae``
    (a registered SAE's id or name, as the CLI names them, or an SAE folder)."""
    from cli.common import sae_ref, steering_service
    from millm.sae.cards import folder_of

    if not refs:
        return [(b.id, b.path, b.layer, b.model) for b in bundled_saes()]
    service = steering_service()
    found = []
    for ref in refs:
        if Path(ref).expanduser().exists():
            loaded = load_sae(Path(ref).expanduser())
            folder = folder_of(Path(ref).expanduser())
            found.append((folder.name, folder, loaded.layer_hint, loaded.model_hint or BUNDLED_ID))
            continue
        record = service.sae(sae_ref(ref))
        model_id = record["model_hint"] or BUNDLED_ID
        found.append((record["id"], folder_of(record["path"]), record["layer_hint"], model_id))
    for sae_id, _, layer, _ in found:
        if layer is None:
            raise SystemExit(f"{sae_id} has no layer hint to read it at")
    return found


def reconstruction(model: Any, sae: SAE, layer: int, windows: torch.Tensor, ce_windows: int) -> None:
    """The held-out figures, by millm.sae.training.quality (what ``millm sae train`` prints): FVU and dead features over
    every window, CE over the first ``ce_windows``."""
    acts = activations.collect(model, windows, layer)
    fraction, fired = quality.fvu(sae, acts)
    print(f"  held-out tokens {acts.shape[0]}: FVU {fraction:.4f} (target <= {quality.FVU_TARGET})")
    print(f"  dead features {int((~fired).sum())}/{sae.d_sae} = {float((~fired).float().mean()):.2%} (target <= 5%)")
    ce = quality.measure(model, sae, layer, windows[:ce_windows])
    print(f"  CE over {ce.ce_tokens} tokens: clean {ce.ce_clean:.4f}, SAE spliced {ce.ce_spliced:.4f}, layer zeroed "
          f"{ce.ce_zeroed:.4f}: SAE costs {ce.ce_share:.2%} of the zero-ablation gap "
          f"(target <= {quality.CE_SHARE_TARGET:.0%})")


def concept_words(folder: Path, feature: int) -> tuple[str, ...]:
    """The words that count as mentioning a feature's concept: its top tokens (features.jsonl) that are words."""
    return top_token_words(feature_rows(folder).get(feature, {}))


def steering(engine: TransformersEngine, sae_id: str, sae: SAE, layer: int, folder: Path,
             concepts: list[tuple[str, float]], prompts: tuple[str, ...]) -> None:
    index = LabelIndex.load(folder, sae_id)
    if not concepts:
        print("  steering: no concept features listed for this SAE")
        return
    control = engine.steering
    control.attach(sae_id, sae, layer)
    measure = Measure(engine, prompts, SEED, MAX_NEW_TOKENS)
    print(f"  unsteered answers: mean log-prob {measure.plain_logprob:.3f} nats/token")
    try:
        for name, strength in concepts:
            feature = index.resolve(name)
            words = concept_words(folder, feature)
            point = measure.at(sae_id, feature, strength, words)
            base = concept_rate(measure.plain, words)
            print(f"  steer {name}={strength:g} (feature {feature}: {index.labels[feature]}; words "
                  f"{', '.join(words)}): mentions {point.rate:.0%} "
                  f"steered vs {base:.0%} unsteered; log-prob {point.logprob:.3f} ({point.fluency:+.3f} vs "
                  f"unsteered, bound -{FLUENCY_BOUND}); e.g. {point.example[:90]!r}")
    finally:
        control.detach_all()


def throughput(sae: SAE, acts_like: torch.Tensor, train_json: Path) -> None:
    config = TrainConfig(d_in=sae.d_in, d_sae=sae.d_sae, k=32, steps=6, batch_size=4096)
    buffer = acts_like.repeat(-(-4096 // acts_like.shape[0]) + 1, 1)[:4096 * 2]
    trainer = TopKTrainer(config, buffer.mean(0), 1.0)
    batches = ShuffledBatches(buffer, 4096, 0)
    trainer.step(batches.batch(0))
    started = time.perf_counter()
    for i in range(1, 6):
        trainer.step(batches.batch(i))
    rate = 5 * 4096 / (time.perf_counter() - started)
    print(f"  training throughput now: {rate:,.0f} tokens/s at d_sae {sae.d_sae}, batch 4096")
    if train_json.is_file():
        info = json.loads(train_json.read_text())
        seconds = info["seconds"]
        print(f"  its documented command: {info['tokens']} tokens x {info['spec']['epochs']} epochs; "
              f"corpus+activations {seconds['corpus_and_activations']} s, training {seconds['training']} s, "
              f"labelling {seconds['labelling']} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sae", action="append", help="a registered SAE's id or name, or an SAE folder "
                                                      "(repeatable; default: the bundled ones)")
    parser.add_argument("--ce-windows", type=int, default=24, help="held-out windows for the CE figures")
    parser.add_argument("--skip-steering", action="store_true")
    parser.add_argument("--skip-reconstruction", action="store_true", help="only the steering figures")
    parser.add_argument("--concept", action="append", default=[], metavar="NAME=S",
                        help="measure this feature (label or index) at strength S instead of the documented list")
    parser.add_argument("--prompts", type=int, default=len(NEUTRAL_PROMPTS), help="first N neutral prompts")
    args = parser.parse_args()
    override = [(name, float(value)) for name, _, value in (c.rpartition("=") for c in args.concept)]
    prompts = NEUTRAL_PROMPTS[:args.prompts]
    settings = get_settings()
    engines: dict[str, TransformersEngine] = {}
    for sae_id, folder, layer, model_id in chosen_saes(args.sae):
        if model_id not in engines:
            loaded_engine = load_engine(resolve(model_id, settings), settings)
            assert isinstance(loaded_engine, TransformersEngine), "SAE quality is measured on transformers models"
            engines[model_id] = loaded_engine
        engine = engines[model_id]
        model = engine.model
        loaded = load_sae(folder)
        print(f"{sae_id} ({model_id}, layer {layer}, d_sae {loaded.sae.d_sae}, k {loaded.sae.k}):")
        if not args.skip_reconstruction:
            windows = held_out(engine, settings, run_spec(model_id, folder))
            reconstruction(model, loaded.sae, layer, windows, args.ce_windows)
            throughput(loaded.sae, activations.collect(model, windows[:16], layer), folder / "train.json")
        if not args.skip_steering:
            steering(engine, sae_id, loaded.sae, layer, folder, override or CONCEPTS.get(sae_id, []), prompts)


if __name__ == "__main__":
    main()
