"""``millm sae train`` and ``millm sae features``: make an SAE for a model, and find its features by label."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli.common import check_seed, err, out, reports_errors, sae_ref, steering_service
from millm.config import get_settings
from millm.errors import InvalidParameter
from millm.paths import user_path

if TYPE_CHECKING:
    from millm.sae.labels import LabelIndex
    from millm.sae.measured import HeldOut
    from millm.sae.training.train import StepStats


def _sae_folder(ref: str) -> tuple[Path, str]:
    """An SAE named by registered id (bundled ones included) or by its folder; (folder, name)."""

    path = user_path(ref)
    if path.exists():
        return (path if path.is_dir() else path.parent), ref
    found = steering_service().sae(sae_ref(ref))
    folder = Path(found["path"])
    return (folder if folder.is_dir() else folder.parent), ref


def label_index_of(ref: str) -> LabelIndex:
    """The labels ``ref`` names features by: a registered SAE's (``SteeringService.label_index``), or a folder's
    own ``labels.json`` when ``ref`` is a folder no registration covers."""
    from millm.sae.cards import folder_of
    from millm.sae.labels import LabelIndex

    service = steering_service()
    if not user_path(ref).exists():
        return service.label_index(sae_ref(ref))
    folder = folder_of(user_path(ref)).resolve()
    known = [r["id"] for r in service.store.saes() if folder_of(r["path"]).resolve() == folder]
    return service.label_index(known[0]) if known else LabelIndex.load(folder, ref)


def steer_assignments(items: list[str], sae: str | None, model_id: str) -> dict[int, float]:
    """``--steer`` values: ``123=40`` as they are, ``weather=60`` looked up in the labels of ``--sae`` (or of
    the one SAE attached to ``model_id``); an ambiguous or unknown name is refused listing candidates. A feature
    named without ``=STRENGTH`` (``weather``, ``123``) takes its recommended strength, and stderr says which."""
    from millm.sae.cards import index_of
    from millm.sae.labels import LabelIndex
    from millm.steering.values import check_values

    service = steering_service()
    if all(index_of(item.rpartition("=")[0]) is not None for item in items):
        values = LabelIndex({}, sae or "the SAE").resolve_assignments(items)
        return check_values(values, int(service.sae(sae)["d_sae"]), "steer") if sae is not None else values
    target = sae
    if target is None:
        attached = list(service.attached_layers(model_id))
        if len(attached) != 1:
            raise InvalidParameter("--steer NAME=STRENGTH needs --sae (or exactly one attached SAE) to look the "
                                   "name up in.", param="steer")
        target = attached[0]
    return label_index_of(target).resolve_assignments(items, said=lambda line: err.print(line, markup=False))


class _Bar:
    """The rich progress display: one bar per phase; training shows tokens/s, loss, L0, FVU and dead."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: Any = None
        self.started = time.monotonic()
        self.tokens0: int | None = None

    def phase(self, name: str, total: int) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=self.progress.tasks[self.task].total)
        self.task = self.progress.add_task(name, total=total, stats="")
        self.started, self.tokens0 = time.monotonic(), None

    def advance(self, done: int) -> None:
        self.progress.update(self.task, completed=done)

    def step(self, stats: StepStats, tokens: int) -> None:
        if self.tokens0 is None:
            self.tokens0, self.started = tokens, time.monotonic()
        rate = (tokens - self.tokens0) / max(1e-9, time.monotonic() - self.started)
        self.progress.update(self.task, stats=f"{rate:,.0f} tok/s  loss {stats.loss:.4f}  L0 {stats.l0:.1f}  "
                                              f"FVU {stats.fvu:.4f}  dead {stats.dead_fraction:.1%}")


def _check_new_sae_name(name: str, written: Path | None = None) -> None:
    """Refuse a ``--name`` that breaks the name rule or that a registered SAE already has (as id or name)."""
    from millm.names import check_name

    check_name(name, "name")
    service = steering_service()
    holder = service.store.sae(name) or next((r for r in service.store.saes() if r["name"] == name), None)
    if holder is None:
        return
    where = f"The SAE is written to {written} but not registered; register it with `millm sae add`. " if written else ""
    raise InvalidParameter(f"An SAE named '{name}' is already registered (id {holder['id']}, {holder['path']}); "
                           f"{where}choose another --name (see `millm sae list`).", param="name")


def heldout_line(heldout: dict[str, Any]) -> str:
    """The held-out figures ``millm sae train`` prints (``train.json``'s ``heldout``)."""
    from millm.sae.training.quality import CE_SHARE_TARGET, FVU_TARGET

    if "skipped" in heldout:
        return f"held-out FVU and CE share: {heldout['skipped']}"
    return (f"held-out ({heldout['windows']} windows, {heldout['tokens']} tokens): FVU {heldout['fvu']:.4f} "
            f"(target <= {FVU_TARGET:g}); CE share of the zero-ablation gap {heldout['ce_share']:.2%} "
            f"(target <= {CE_SHARE_TARGET:.0%}; next-token loss clean {heldout['ce_clean']:.4f}, SAE spliced "
            f"{heldout['ce_spliced']:.4f}, layer zeroed {heldout['ce_zeroed']:.4f}); dead features "
            f"{heldout['dead_fraction']:.1%}")


def _check_name(name: str | None, register: bool) -> None:
    """``--name`` registers the SAE, so it needs registering on, and a name no SAE holds (checked before any model
    or file work: a taken name wastes no run)."""
    if name is None:
        return
    if not register:
        raise InvalidParameter("--name registers the SAE under that name; drop --no-register or --name.",
                               param="name")
    _check_new_sae_name(name)


def _output_folder(home: Path, model_id: str, layer: int, name: str | None, output: Path | None) -> Path:
    """Where the SAE is written: ``--output``, else ``home/saes/NAME``, else ``home/saes/MODEL-L<layer>``."""
    if output is not None:
        return user_path(output)
    return home / "saes" / (name or f"{model_id.replace('/', '--')}-L{layer}")


def _register_trained(output: Path, name: str | None) -> None:
    """Register the SAE written to ``output`` (under ``name``, when given: checked again, as another may have
    taken it while this run trained)."""
    if name is not None:
        _check_new_sae_name(name, written=output)
    record = steering_service().register_sae(output, name, sae_id=name)
    out.print(f"registered as {record['id']}", markup=False)


def train(
    layer: Annotated[int, typer.Option(help="Decoder layer whose output (resid_post) the SAE reads.")],
    model: Annotated[str | None, typer.Option(help="Model id (default: the bundled one).")] = None,
    width: Annotated[int | None, typer.Option(help="Latents (default: 8 x the model's width).")] = None,
    k: Annotated[int, typer.Option(help="Latents active per token (TopK).")] = 32,
    tokens: Annotated[int, typer.Option(help="Activation tokens to collect.")] = 400_000,
    epochs: Annotated[float, typer.Option(help="Passes over the collected tokens.")] = 1.0,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Tokens per optimiser step.")] = 4096,
    context: Annotated[int, typer.Option(help="Tokens per window the model reads.")] = 256,
    lr: Annotated[float, typer.Option(help="Adam learning rate (0: scaled with the width).")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed for the corpus, the shuffle and the initialisation.")] = 0,
    corpus: Annotated[list[Path] | None, typer.Option(help="Text/jsonl file or folder to train on (repeatable; "
                                                           "default: text the model writes + Python's docs).")] = None,
    generated_docs: Annotated[int, typer.Option("--generated-docs", help="Documents the model writes for the "
                                                "default corpus (cached).")] = 256,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Folder for the SAE "
                                                "(default: MILLM_HOME/saes/MODEL-L<layer>).")] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda or auto (default: the configured device).")] = None,
    save_dtype: Annotated[str, typer.Option("--save-dtype", help="float32, or bfloat16 for half the size.")
                          ] = "float32",
    resume: Annotated[bool, typer.Option(help="Continue the unfinished run in --output.")] = False,
    register: Annotated[bool, typer.Option(help="Register the finished SAE (see `millm sae list`).")] = True,
    name: Annotated[str | None, typer.Option(help="Register the SAE under this name, its id: `millm chat --sae "
                                                  "NAME` and `millm sae features NAME` work with it (default "
                                                  "--output: MILLM_HOME/saes/NAME). A taken name is refused "
                                                  "before training.")] = None,
    eval_windows: Annotated[int, typer.Option("--eval-windows", min=0, help="Held-out windows (of --context "
                                              "tokens) the FVU and CE share are measured on after training "
                                              "(0: not measured).")] = 24,
) -> None:
    """Train a TopK SAE on a model's residual stream at LAYER; writes SAELens files and labels, then measures
    its held-out FVU and CE share of the zero-ablation gap (also in train.json)."""
    from millm.engine.loader import load
    from millm.engine.transformers_engine import TransformersEngine
    from millm.registry import resolve
    from millm.research.answers import sample_answers
    from millm.sae.training import recipe

    check_seed(seed)
    _check_name(name, register)
    settings = get_settings()
    if device is not None:
        settings = settings.model_copy(update={"device": device})
    entry = resolve(model or settings.default_model, settings)
    folder = _output_folder(settings.home, entry.id, layer, name, output)
    spec = recipe.RunSpec(model_id=entry.id, layer=layer, output=folder, width=width, k=k, tokens=tokens,
                          epochs=epochs, batch_size=batch_size, context=context, lr=lr, seed=seed,
                          corpus_paths=tuple(corpus or ()), generated_documents=generated_docs,
                          save_dtype=save_dtype, resume=resume, eval_windows=eval_windows)
    started = time.monotonic()
    with err.status(f"loading {entry.id} ..."):
        loaded, tokenizer, placed, dtype = load(entry, settings)
    engine = TransformersEngine(entry, loaded, tokenizer, placed, dtype)  # writes the default corpus's text
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[stats]}"))
    with Progress(*columns, console=err) as progress:
        bar = _Bar(progress)
        try:
            result = recipe.run(spec, loaded, tokenizer, settings.cache_dir,
                                recipe.Progress(phase=bar.phase, advance=bar.advance, step=bar.step),
                                answer=lambda prompts, seed, tokens: sample_answers(engine, prompts, seed, tokens)[0])
        except (ValueError, FileExistsError) as exc:
            raise InvalidParameter(str(exc)) from None
    final = result.summary["final"] or {}
    out.print(f"SAE written to {result.output}: d_sae={result.summary['train_config']['d_sae']} "
              f"k={k} tokens={result.summary['tokens']} FVU(last batch)={final.get('fvu', float('nan')):.4f} "
              f"live features={result.summary['live_features']}", markup=False)
    out.print(heldout_line(result.summary["heldout"]), markup=False)
    if register:
        _register_trained(result.output, name)
    out.print(f"wall time {time.monotonic() - started:.0f} s", markup=False)


def _recommended_cell(held: HeldOut | None) -> str:
    """A listing's recommended strength with the held-out rate and interval it rests on ("-" when unmeasured)."""
    if held is None:
        return "-"
    if held.strength is None:
        return "none"
    shown = f"{held.rate:.0%} [{held.low:.0%}-{held.high:.0%}]"
    return f"{held.strength:g} ({shown})" if held.recommended else f"none ({shown} at {held.strength:g})"


def features(
    sae: Annotated[str, typer.Argument(help="SAE id (see `millm sae list`) or folder.")],
    index: Annotated[int | None, typer.Argument(help="A feature index: print its card (label, firing rate, "
                                                     "max-activating examples, promoted tokens).")] = None,
    search: Annotated[str | None, typer.Option(help="Only features whose label contains this: whole-word "
                                                    "matches first, then features measured to steer.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="Most features to list.")] = 50,
) -> None:
    """List an SAE's labelled features (best label matches first with --search), or print one feature's card."""
    from millm.render.card import card_text
    from millm.sae.cards import feature_rows, read_card
    from millm.sae.measured import held_out_of

    folder, name = _sae_folder(sae)
    if index is not None:
        if search is not None:
            raise InvalidParameter("Give a feature INDEX or --search, not both.", param="search")
        out.print(card_text(read_card(folder, index, _width(sae, folder), name=name)))
        return
    matches = label_index_of(sae).rows(search, limit)
    details = feature_rows(folder)
    table = Table("feature", "label", "fires on", "recommended (held-out rate, 90%)", "promotes")
    for m in matches:
        item = details.get(m["index"], {})
        freq = f"{item['frequency']:.2%}" if "frequency" in item else "-"
        promotes = " ".join(t.strip() for t in item.get("promotes", [])[:5]) or "-"
        table.add_row(str(m["index"]), m["label"], freq, _recommended_cell(held_out_of(item)), promotes)
    out.print(table)
    if not matches:
        err.print(f"no feature label of {name} contains {search!r}" if search else f"{name} has no labels")


def _width(ref: str, folder: Path) -> int:
    """The SAE's number of features: its registry record's, or read from the SAE at ``folder``."""
    from millm.sae.formats import load_sae

    if user_path(ref).exists():
        return load_sae(folder).sae.d_sae
    return int(steering_service().sae(sae_ref(ref))["d_sae"])


def register(sae_app: typer.Typer) -> None:
    """Add ``train`` and ``features`` to ``millm sae``."""
    sae_app.command("train")(reports_errors(train))
    sae_app.command("features")(reports_errors(features))
