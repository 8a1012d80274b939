"""Detection on bench/sweep.py's ten concepts: the held-out AUROC of a DiffMean probe and a logistic probe
against the best single feature of the bundled SAEs.

    python bench/probes.py                                   # 48 + 48 answers of 48 tokens per concept
    python bench/probes.py --examples 16 --tokens 32         # the small configuration
    python bench/probes.py --concept rain --examples 8       # a quick check

Per concept, the model writes ``--examples`` answers about it and as many about other topics (seeded, kept by
mention: ``millm.vectors.learn.generated``, as ``millm probes learn --concept`` does); a third of each side is
held out (``millm.probes.learn.split``). The probes are learned at ``--layer`` (``millm.probes.learn.learn``) and
scored as served: each answer's ``max`` over its positions (``--aggregation``). The SAE baseline reads each
bundled SAE at its own layer: every feature's activation, aggregated the same way, its feature chosen by its
AUROC on the training split and reported on the held-out one. Printed: one row per concept and the mean.
Everything runs on one loaded model in this process; nothing is stored.
"""

from __future__ import annotations

import argparse
import time

import torch

from millm.config import get_settings
from millm.engine import load_engine
from millm.probes.learn import aggregate, auroc, learn, read, split
from millm.registry import BUNDLED_ID, resolve
from millm.sae.bundled import bundled_saes
from millm.sae.formats import load_sae
from millm.sae.labels import LabelIndex
from millm.vectors.learn import generated

CONCEPTS = ("rain", "dog", "food", "money", "car", "city", "winter", "book", "sport", "garden")  # bench/sweep.py's


def feature_scores(engine, sae, layer: int, texts: list[str], aggregation: str) -> torch.Tensor:
    """``[len(texts), d_sae]``: each text's feature activations, aggregated over its positions."""
    with torch.inference_mode():
        return torch.stack([aggregate([a for a in sae.encode(span).T], aggregation)
                            for span in read(engine, texts, layer)])


def feature_aurocs(positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
    """``[d_sae]``: each feature's AUROC (ties half)."""
    diff = positive[:, None, :] - negative[None, :, :]
    return ((diff > 0).float() + 0.5 * (diff == 0).float()).mean((0, 1))


def best_feature(engine, examples, seed: int, aggregation: str, saes) -> tuple[str, int, float, float]:
    """The bundled SAEs' feature with the best training AUROC: (sae, feature, train AUROC, held-out AUROC)."""
    parts = split(examples, seed)
    best = ("", -1, -1.0, 0.0)
    for bundled, sae in saes:
        pos_train, neg_train, pos_held, neg_held = (
            feature_scores(engine, sae, bundled.layer, texts, aggregation)
            for texts in (parts.train.positive, parts.train.negative, parts.held.positive, parts.held.negative))
        train = feature_aurocs(pos_train, neg_train)
        index = int(train.argmax())
        if float(train[index]) > best[2]:
            best = (bundled.id, index, float(train[index]), auroc(pos_held[:, index], neg_held[:, index]))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concept", action="append", choices=CONCEPTS, help="only this concept (repeatable)")
    parser.add_argument("--examples", type=int, default=48, help="answers written on each side")
    parser.add_argument("--tokens", type=int, default=48, help="tokens per answer")
    parser.add_argument("--layer", type=int, default=14)
    parser.add_argument("--aggregation", default="max", choices=("max", "mean", "last"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    settings = get_settings()
    engine = load_engine(resolve(BUNDLED_ID, settings), settings)
    saes = [(b, load_sae(b.path).sae.to("cpu", torch.float32)) for b in bundled_saes()]
    labels = {b.id: LabelIndex.load(b.path, b.id).labels for b, _ in saes}
    print(f"{args.examples} + {args.examples} answers of {args.tokens} tokens per concept, probes at layer "
          f"{args.layer}, {args.aggregation} over the answer; held-out AUROC")
    print(f"{'concept':<8} {'kept':>7} {'diffmean':>9} {'logreg':>7}  best SAE feature (train AUROC) held-out")
    rows = []
    for concept in args.concept or CONCEPTS:
        began = time.monotonic()
        examples = generated(engine, [concept], args.examples, args.seed, args.tokens)
        figures = [learn(engine, concept, examples, args.layer, method=m, aggregation=args.aggregation,
                         seed=args.seed).figures.auroc for m in ("diffmean", "logreg")]
        sae_id, feature, train, held = best_feature(engine, examples, args.seed, args.aggregation, saes)
        named = f" {labels[sae_id].get(feature, '')!r}"
        rows.append((*figures, held))
        print(f"{concept:<8} {len(examples.positive):>3}+{len(examples.negative):<3} {figures[0]:>9.3f} "
              f"{figures[1]:>7.3f}  {sae_id}#{feature}{named} ({train:.3f}) {held:.3f}   "
              f"[{time.monotonic() - began:.0f} s]", flush=True)
    means = [sum(r[i] for r in rows) / len(rows) for i in range(3)]
    print(f"{'mean':<8} {'':>7} {means[0]:>9.3f} {means[1]:>7.3f}  best SAE feature {means[2]:.3f}")


if __name__ == "__main__":
    main()
