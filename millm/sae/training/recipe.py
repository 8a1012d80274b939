"""``millm sae train`` end to end: corpus, activations, training, SAELens files, labels.

After labelling, the SAE's reconstruction is measured on the held-out split (at most ``eval_windows``
windows of it; :mod:`millm.sae.training.quality`): FVU and the CE share of the zero-ablation gap, recorded in
``train.json`` under ``heldout``.

Work files (token windows, the activation buffer, the trainer checkpoint) live in ``OUT/.work`` and are
written so that a killed run resumes where it stopped (``resume=True``); they are removed when the SAE,
its labels and ``train.json`` are written. Every random choice follows ``seed``.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from millm.sae import activations, example_tokens, labels, saelens
from millm.sae.training import corpus, quality
from millm.sae.training.train import CHECKPOINT, ShuffledBatches, StepStats, TopKTrainer, TrainConfig, train

WORK = ".work"
SKIP_FIRST = 1  # the first position of each window is an attention sink with an outlier norm


@dataclass(frozen=True)
class RunSpec:
    """What to train: the model, where to read it, and how big."""

    model_id: str
    layer: int
    output: Path
    width: int | None = None  # None: 8 x d_model
    k: int = 32
    tokens: int = 400_000
    epochs: float = 1.0
    batch_size: int = 4096
    context: int = 256
    lr: float = 0.0
    seed: int = 0
    corpus_paths: tuple[Path, ...] = ()
    generated_documents: int = 256  # the default corpus: documents the model writes (1-2 per topic)
    holdout_fraction: float = 0.1
    eval_windows: int = 24  # held-out windows the FVU and CE figures are measured on (0: not measured)
    save_dtype: str = "float32"
    resume: bool = False


@dataclass
class Progress:
    """Callbacks a front end renders; every one is optional."""

    phase: Callable[[str, int], None] = lambda name, total: None
    advance: Callable[[int], None] = lambda done: None
    step: Callable[[StepStats, int], None] = lambda stats, tokens: None


@dataclass
class Result:
    output: Path
    summary: dict[str, Any] = field(default_factory=dict)


def _windows_needed(spec: RunSpec) -> int:
    return -(-spec.tokens // (spec.context - SKIP_FIRST))


def documents(spec: RunSpec, answer: corpus.Answerer | None, tokenizer: Any, cache_dir: Path,
              progress: Progress | None = None) -> tuple[list[str], list[str]]:
    """(training, held-out) documents: the ``--corpus`` files, or the default corpus (generated part
    first, answered by ``answer``, then Python's documentation), each part split with the same held-out
    fraction."""
    if spec.corpus_paths:
        return corpus.split_documents(corpus.read_corpus(spec.corpus_paths), spec.holdout_fraction, spec.seed)
    if answer is None:
        raise ValueError("The default corpus is written by the model: hand the recipe an engine's answers.")
    progress = progress or Progress()
    progress.phase("the model writes everyday text", spec.generated_documents)
    generated = corpus.generated_corpus(answer, tokenizer, cache_dir, spec.model_id, documents=spec.generated_documents,
                                        seed=spec.seed, on_batch=lambda done, total: progress.advance(done))
    gen_train, gen_held = corpus.split_documents(generated, spec.holdout_fraction, spec.seed)
    doc_train, doc_held = corpus.split_documents(corpus.python_documentation(), spec.holdout_fraction, spec.seed)
    return gen_train + doc_train, gen_held + doc_held


def heldout_windows(spec: RunSpec, tokenizer: Any, held_docs: list[str]) -> dict[str, Any]:
    """``{"windows": [n, context]}``, the first ``eval_windows`` windows of the held-out documents (the
    bench's held-out windows), or ``{"skipped": why}`` when there is nothing to measure on."""
    if spec.eval_windows < 1:
        return {"skipped": "not measured (eval_windows is 0)"}
    if not held_docs:
        return {"skipped": "no held-out documents"}
    try:
        return {"windows": corpus.token_windows(tokenizer, held_docs, spec.context, spec.eval_windows)}
    except ValueError as exc:
        return {"skipped": f"the held-out split is too small: {exc}"}


def _measure(spec: RunSpec, model: Any, tokenizer: Any, cache_dir: Path, work: Path,
             progress: Progress, answer: corpus.Answerer | None) -> dict[str, Any]:
    """The held-out figures for ``train.json`` (``heldout``): as :class:`quality.Reconstruction`, or ``skipped``."""
    path = work / "heldout.pt"
    if path.is_file():
        held = torch.load(path, weights_only=True)
    else:  # a run resumed from work files written before held-out windows were kept
        held = heldout_windows(spec, tokenizer, documents(spec, answer, tokenizer, cache_dir, progress)[1])
    if "windows" not in held:
        return {"skipped": held["skipped"]}
    progress.phase("held-out FVU and CE", 4)
    figures = quality.measure(model, saelens.load(spec.output), spec.layer, held["windows"], progress.advance)
    return asdict(figures)


def _buffer(spec: RunSpec, work: Path, model: Any, windows: torch.Tensor, progress: Progress) -> torch.Tensor:
    """The activation buffer ``[rows, d_model]`` (fp16 on disk), collected or resumed."""
    d_model = int(model.config.hidden_size)
    rows = windows.shape[0] * (windows.shape[1] - SKIP_FIRST)
    path, state_path = work / "activations.f16", work / "activations.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {"windows": 0}
    if not path.is_file() or path.stat().st_size != rows * d_model * 2:
        state = {"windows": 0}
        with path.open("wb") as f:
            f.truncate(rows * d_model * 2)
    buffer = torch.from_file(str(path), shared=True, size=rows * d_model, dtype=torch.float16).view(rows, d_model)
    if state["windows"] < windows.shape[0]:
        progress.phase(f"reading layer {spec.layer}", windows.shape[0])

        def saved(done: int, _: int) -> None:
            if done % 64 == 0 or done == windows.shape[0]:
                state_path.write_text(json.dumps({"windows": done}))
            progress.advance(done)

        activations.collect(model, windows, spec.layer, skip_first=SKIP_FIRST, out=buffer, start=state["windows"],
                            on_batch=saved)
    return buffer


def _statistics(buffer: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The buffer's mean and the input scale making its mean norm sqrt(d_in)."""
    total, norms, n = torch.zeros(buffer.shape[1], dtype=torch.float64), 0.0, buffer.shape[0]
    for lo in range(0, n, 65536):
        chunk = buffer[lo:lo + 65536].float()
        total += chunk.sum(0).double()
        norms += float(chunk.norm(dim=-1).double().sum())
    return (total / n).float(), buffer.shape[1] ** 0.5 / (norms / n)


def _trainer(spec: RunSpec, work: Path, buffer: torch.Tensor, d_sae: int) -> TopKTrainer:
    checkpoint = work / CHECKPOINT
    if spec.resume and checkpoint.is_file():
        trainer, _ = TopKTrainer.from_checkpoint(checkpoint)
        return trainer
    steps = max(1, round(buffer.shape[0] * spec.epochs / spec.batch_size))
    config = TrainConfig(d_in=buffer.shape[1], d_sae=d_sae, k=spec.k, steps=steps, batch_size=spec.batch_size,
                         lr=spec.lr, seed=spec.seed)
    mean, scale = _statistics(buffer)
    return TopKTrainer(config, mean, scale)


def _label(model: Any, tokenizer: Any, sae: Any, layer: int, buffer: torch.Tensor, windows: torch.Tensor,
           progress: Progress) -> list[labels.FeatureRecord]:
    per_window = windows.shape[1] - SKIP_FIRST
    batches = (buffer[lo:lo + 4096] for lo in range(0, buffer.shape[0], 4096))
    progress.phase("labelling features", buffer.shape[0])
    done = [0]

    def counted() -> Any:
        for b in batches:
            yield b
            done[0] += b.shape[0]
            progress.advance(done[0])

    top = labels.top_activations(sae, counted())
    flat = windows[:, SKIP_FIRST:].reshape(-1)
    texts = [tokenizer.decode([i]) for i in range(len(tokenizer))]

    def context_of(row: int) -> str:
        w, p = divmod(row, per_window)
        p += SKIP_FIRST
        before = tokenizer.decode(windows[w, max(0, p - 12):p].tolist())
        after = tokenizer.decode(windows[w, p + 1:p + 4].tolist())
        return f"{before}«{texts[int(windows[w, p])]}»{after}"

    records = labels.build_records(top, flat, texts, context_of, promotes=promoted_tokens(model, sae))
    examples = sum(len(r.examples) for r in records)
    progress.phase("reading the examples' tokens", examples)
    example_tokens.add_tokens([{"index": r.index, "examples": r.examples} for r in records], model, tokenizer, sae,
                              layer, progress.advance)
    return records


@torch.inference_mode()
def promoted_tokens(model: Any, sae: Any, count: int = 8) -> torch.Tensor:
    """Per feature, the token ids its decoder direction raises most through the final norm and unembedding."""
    head = model.get_output_embeddings().weight.float().cpu()
    norm = getattr(model.get_decoder(), "norm", None)
    gain = norm.weight.float().cpu() if norm is not None and getattr(norm, "weight", None) is not None else 1.0
    out = []
    for lo in range(0, sae.d_sae, 512):
        out.append(((sae.W_dec[lo:lo + 512].float() * gain) @ head.T).topk(count, dim=-1).indices)
    return torch.cat(out)


def _check_output(spec: RunSpec, work: Path) -> None:
    """``spec.output`` is free for a new run: no unfinished run in it (unless resuming one) and no SAE."""
    if work.exists() and not spec.resume:
        raise FileExistsError(f"{spec.output} holds an unfinished run; pass --resume to continue it, or choose "
                              "another --output.")
    if (spec.output / saelens.WEIGHTS).exists() and not spec.resume:
        raise FileExistsError(f"{spec.output} already holds an SAE; choose another --output.")


def _training_windows(spec: RunSpec, work: Path, answer: corpus.Answerer | None, tokenizer: Any, cache_dir: Path,
                      progress: Progress) -> torch.Tensor:
    """The training token windows: from the work folder when a run saved them, else made from the corpus (the
    held-out windows saved beside them)."""
    windows_path = work / "windows.pt"
    if windows_path.is_file():
        return torch.load(windows_path, weights_only=True)
    train_docs, held_docs = documents(spec, answer, tokenizer, cache_dir, progress)
    windows = corpus.token_windows(tokenizer, train_docs, spec.context, _windows_needed(spec))
    torch.save(heldout_windows(spec, tokenizer, held_docs), work / "heldout.pt")
    torch.save(windows, windows_path)
    return windows


def _saelens_meta(spec: RunSpec) -> dict[str, Any]:
    """The SAELens config keys that say where the SAE reads the model and what it was trained on."""
    return {"model_name": spec.model_id, "hook_name": f"blocks.{spec.layer}.hook_resid_post",
            "hook_layer": spec.layer, "context_size": spec.context, "prepend_bos": False,
            "dataset_path": (",".join(map(str, spec.corpus_paths))
                             or "generated by the model (millm.sae.training.corpus)")}


def _spec_record(spec: RunSpec) -> dict[str, Any]:
    """``spec`` as ``train.json`` records it: paths as text, without the output folder and the resume flag."""
    record = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(spec).items() if k not in ("output", "resume")}
    record["corpus_paths"] = [str(p) for p in spec.corpus_paths]
    return record


def _stats_record(stats: list[StepStats]) -> dict[str, Any] | None:
    """A step's statistics as ``train.json`` records them; None when no step ran."""
    return asdict(stats[0]) if stats else None


def run(spec: RunSpec, model: Any, tokenizer: Any, cache_dir: Path, progress: Progress | None = None,
        answer: corpus.Answerer | None = None) -> Result:
    """Train, save and label one SAE as ``spec`` says (``answer`` writes the default corpus's everyday text);
    returns where and a summary (also train.json)."""
    progress = progress or Progress()
    activations.check_layer(model, spec.layer)
    work = spec.output / WORK
    _check_output(spec, work)
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    windows = _training_windows(spec, work, answer, tokenizer, cache_dir, progress)
    buffer = _buffer(spec, work, model, windows, progress)
    collected = time.monotonic()
    d_sae = spec.width or 8 * int(model.config.hidden_size)
    trainer = _trainer(spec, work, buffer, d_sae)
    progress.phase("training", trainer.config.steps)
    batches = ShuffledBatches(buffer, trainer.config.batch_size, spec.seed)
    first: list[StepStats] = []
    last: list[StepStats] = []

    def on_step(stats: StepStats) -> None:
        first[:] = first or [stats]
        last[:] = [stats]
        progress.step(stats, trainer.step_index * trainer.config.batch_size)
        progress.advance(trainer.step_index)

    train(trainer, batches, checkpoint_dir=work, on_step=on_step)
    trained = time.monotonic()
    sae = trainer.export()
    saelens.save(spec.output, sae, _saelens_meta(spec), spec.save_dtype)
    records = _label(model, tokenizer, saelens.load(spec.output), spec.layer, buffer, windows, progress)
    labels.write_labels(spec.output, records)
    labelled = time.monotonic()
    heldout = _measure(spec, model, tokenizer, cache_dir, work, progress, answer)
    summary = {"spec": _spec_record(spec),
               "train_config": asdict(trainer.config), "windows": windows.shape[0], "tokens": buffer.shape[0],
               "first": _stats_record(first), "final": _stats_record(last),
               "live_features": len(records), "heldout": heldout,
               "seconds": {"corpus_and_activations": round(collected - started, 1),
                           "training": round(trained - collected, 1),
                           "labelling": round(labelled - trained, 1),
                           "heldout": round(time.monotonic() - labelled, 1)}}
    (spec.output / "train.json").write_text(json.dumps(summary, indent=2))
    del buffer
    shutil.rmtree(work)
    return Result(spec.output, summary)
