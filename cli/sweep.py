"""``millm steer sweep``: one feature at a range of strengths; concept rate, fluency and a recommended strength.
``millm steer screen``: every labelled feature of an SAE, estimated, and the promising ones swept.

The measures are ``millm.research``'s (the ones the benches report), sampled and scored on the engine's
request path. The SAE is attached for the sweep only (``millm chat --sae``'s session,
``millm.steering.session.chat_steering``); live values steer none of the sweep's answers, and afterwards
attachments, values and the active profile are as before; nothing is persisted, except recommended
measures with ``--save``: a strength is chosen on the calibration prompts and verified on the held-out prompts
(``millm.research.held_out``); only a held-out interval that reaches the target makes it recommended.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Column, Table
from rich.text import Text

from cli.common import (
    check_seed,
    engine_for,
    err,
    out,
    reports_errors,
    sae_ref,
    steerable,
    steering_service,
)
from cli.sae_train import steer_assignments
from millm.errors import InvalidParameter
from millm.paths import output_file, user_path

if TYPE_CHECKING:
    from collections.abc import Mapping

    from millm.research.saving import Measured
    from millm.research.screen import Screen, Screened
    from millm.research.sweep import SweepResult
    from millm.sae.measured import HeldOut
    from millm.steering.service import SteeringService
    from millm.steering.target import SteeringTarget

DEFAULT_SAE = "smollm2-135m-res-L10"
SaeOption = Annotated[str | None, typer.Option(help="SAE id, name or folder (default: the one attached, else "
                                                    f"{DEFAULT_SAE}).")]
LayerOption = Annotated[int | None, typer.Option(help="Layer for --sae (default: where it is attached, else its "
                                                      "hint).")]


def named_sae(service: SteeringService, ref: str) -> str:
    """The SAE ``--sae`` names: an id or name, or an SAE folder (its registration, else registered now as
    ``millm sae add`` does). Read from the registry alone, before any model loads."""
    from millm.sae.bundled import register_bundled

    register_bundled(service.store)
    if service.store.sae(ref) is None and user_path(ref).exists():
        path = str(user_path(ref).resolve())
        known = [r["id"] for r in service.store.saes() if r["path"] == path]  # registered already, any id
        return str(known[0]) if known else str(service.register_sae(path)["id"])
    return sae_ref(ref)


def sweep_sae(service: SteeringService, target: SteeringTarget, ref: str | None) -> str:
    """The SAE to sweep: ``--sae`` (:func:`named_sae`), else the one attached SAE, else the bundled
    ``smollm2-135m-res-L10``."""
    if ref is not None:
        return named_sae(service, ref)
    attached = list(target.steering.attachments)
    if len(attached) > 1:
        raise InvalidParameter(f"{len(attached)} SAEs are attached ({', '.join(attached)}); name one with --sae.",
                               param="sae")
    return attached[0] if attached else DEFAULT_SAE


def check_feature(service: SteeringService, sae_id: str, feature: str) -> int:
    """The feature ``feature`` names on ``sae_id`` (an index, or a label as chat --steer reads it), inside its
    width."""
    from millm.sae.cards import check_index

    (index,) = steer_assignments([f"{feature}=1"], sae_id, "")
    return check_index(index, int(service.sae(sae_id)["d_sae"]), sae_id)


def result_table(result: SweepResult) -> Table:
    title = (f"feature {result.feature} ({result.label or 'no label'}) on {result.sae} L{result.layer}: "
             f"{result.prompts} prompts, {result.tokens} tokens, seed {result.seed}")
    table = Table("strength", "concept rate", "fluency Δ", "inside bound?", "relevance Δ", "degenerate",
                  Column("e.g. (first answer)", no_wrap=True, overflow="ellipsis", max_width=60),
                  title=Text(title))  # labels and answers are never markup
    for p in result.points:
        mark = " ←" if p.strength == result.chosen else ""
        table.add_row(f"{p.strength:g}{mark}", f"{p.rate:.0%}", f"{p.fluency:+.2f}",
                      "yes" if p.inside else "no", f"{p.relevance:+.2f}", f"{p.degenerate:.0%}",
                      Text(p.example.replace("\n", " ")))
    return table


def _print_sweep(result: SweepResult) -> None:
    """The sweep as a table, a bar per strength, the unsteered figures and the recommended strength."""
    from millm.research.plots import bar_lines
    from millm.research.sweep import verdict

    out.print(result_table(result))
    for line in bar_lines(result.points, bound=result.bound):
        out.print(line, markup=False)
    out.print(f"unsteered: concept rate {result.unsteered_rate:.0%}, log-prob {result.unsteered_logprob:.3f} "
              f"nats/token; concept words: {', '.join(result.words)}", markup=False)
    out.print(verdict(result), markup=False)


def _save_sweep(folder: Path, index: int, label: str, result: SweepResult, weights: str) -> None:
    """The sweep's held-out measure stored in the SAE's ``features.jsonl``, recommended or not, so the card says
    the best held-out point; a sweep whose calibration chose no strength stores that (on ``weights``), as a
    screen does, so no earlier strength outlives the measure that contradicts it."""
    from millm.research.held_out import unverified
    from millm.research.prompt_sets import PROMPT_SET
    from millm.research.saving import Measured, save_measured

    held = result.held_out or unverified(PROMPT_SET, weights)
    path = save_measured(folder, {index: Measured(held, label)})
    what = (f"recommended_strength {result.recommended:g}" if result.recommended is not None
            else "no recommended strength (the best held-out point)" if result.held_out is not None
            else "no recommended strength (no strength mentions the concept on the calibration prompts)")
    err.print(f"{what} saved for feature {index} in {path}", markup=False)


def sweep(
    feature: Annotated[str, typer.Argument(help="Feature index or label (as chat --steer names it).")],
    strengths: Annotated[str, typer.Option(help="Comma-separated strengths.")] = "0,20,40,60,80",
    prompts: Annotated[int, typer.Option(help="Calibration prompts, one seeded sampled answer each (1-20).")] = 16,
    held_out: Annotated[int, typer.Option(help="Held-out prompts the chosen strength is verified on (1-16).")
                        ] = 16,
    sae: SaeOption = None,
    layer: LayerOption = None,
    tokens: Annotated[int, typer.Option(help="Tokens per answer.")] = 48,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    concept: Annotated[list[str] | None, typer.Option(help="A word that counts as mentioning the concept "
                                                           "(repeatable; default: the label's words).")] = None,
    png: Annotated[Path | None, typer.Option("--out", help="Write the sweep's chart (the console's figure: concept "
                                                           "rate, fluency and relevance) here as a PNG.")] = None,
    theme: Annotated[str, typer.Option(help="The chart's colours: light or dark.")] = "light",
    as_json: Annotated[bool, typer.Option("--json", help="Print the sweep as JSON.")] = False,
    save: Annotated[bool, typer.Option(help="Store the recommended strength in the SAE's features.jsonl "
                                            "(writable SAE folders only).")] = False,
    model: Annotated[str | None, typer.Option(help="Model id (default: the configured one).")] = None,
) -> None:
    """Sweep a feature over strengths: how often answers to neutral prompts mention its concept, what it costs
    in fluency (log-prob under the unsteered model, bound -1.5 nats/token), and the recommended strength."""
    from millm.research.figures import THEMES, sweep_figure
    from millm.research.measure import check_engine
    from millm.research.plots import write_figure
    from millm.research.saving import saveable
    from millm.research.sweep import parse_strengths, sweep_feature
    from millm.sae.cards import folder_of

    values = parse_strengths(strengths)
    check_seed(seed)
    if theme not in THEMES:
        raise InvalidParameter(f"--theme must be one of {', '.join(THEMES)}, got '{theme}'.", param="theme")
    if png is not None:
        png = output_file(png, "--out")
    service = steering_service()
    if sae is not None:  # a bad --sae or feature is refused before the model loads
        check_feature(service, named_sae(service, sae), feature)
    engine = engine_for(model)
    target = steerable(engine)
    sae_id = sweep_sae(service, target, sae)
    folder = folder_of(service.sae(sae_id)["path"])
    index = check_feature(service, sae_id, feature)
    label = service.label_index(sae_id).labels.get(index, "")
    if save:
        saveable(folder)  # refused before the sweep runs, not after
    words = tuple(w.strip().lower() for w in concept or [] if w.strip())
    check_engine(engine)
    with err.status(f"sweeping feature {index} on {sae_id} ..."):
        result = sweep_feature(service, engine, sae_id, index, label=label, words=words,
                               strengths=values, prompts=prompts, held_out=held_out, seed=seed, tokens=tokens,
                               layer=layer)
    if as_json:
        out.print(json.dumps(result.to_json(), indent=2), markup=False)
    else:
        _print_sweep(result)
    if png is not None:
        write_figure(png, sweep_figure(result.to_json()), theme)
        err.print(f"plot written to {png}", markup=False)
    if save:
        from millm.engine.base import numerics

        _save_sweep(folder, index, label, result, numerics(engine))


def _labels_to_screen(labels: dict[int, str], first: int | None, sae_id: str) -> dict[int, str]:
    """The labelled features to screen: all of them, or the first ``first``; an SAE without labels is refused."""
    if not labels:
        raise InvalidParameter(f"{sae_id} has no feature labels to screen.", param="sae")
    return labels if first is None else dict(list(labels.items())[:first])


def _measured(batch: list[Screened]) -> dict[int, Measured]:
    """What a swept batch stores: each feature's held-out measure (recommending a strength or not; one saved
    before is replaced)."""
    from millm.research.saving import Measured

    return {s.feature: Measured(s.held_out, s.label) for s in batch}


def _screen_json(sae_id: str, found: Screen) -> str:
    """The screen as JSON: its settings, every estimate, and each swept feature with its sweep's points."""
    return json.dumps({
        "sae": sae_id, "prompts": found.prompts, "tokens": found.tokens, "seed": found.seed,
        "estimates": {str(f): round(r, 4) for f, r in found.estimates.items()},
        "swept": [{"index": s.feature, "label": s.label, "estimate": round(s.estimate, 4),
                   "unsteered_rate": s.baseline, "recommended_strength": s.recommended,
                   "concept_rate": s.rate, "held_out": s.held_out.to_json(),
                   "points": [dataclasses.asdict(p) for p in s.points]}
                  for s in found.swept]}, indent=2)


def _screen_table(sae_id: str, found: Screen) -> Table:
    """The features that steer their label, with their estimates, recommended strengths and held-out rates."""
    table = Table("feature", "label", "estimated rise", "recommended", "held-out rate [90%]", "calibration",
                  title=Text(f"{sae_id}: {len(found.steers)} of {len(found.swept)} swept features steer their "
                             f"label ({len(found.estimates)} estimated; {found.prompts} prompts, {found.tokens} "
                             f"tokens, seed {found.seed})"))
    for s in found.steers:
        held = s.held_out
        table.add_row(str(s.feature), Text(s.label), f"{s.estimate:+.2f}", f"{s.recommended:g}",
                      f"{held.rate:.0%} [{held.low:.0%}-{held.high:.0%}]", f"{held.calibration_rate:.0%}")
    return table


def _saved_line(found: Screen, measured: Mapping[int, float], folder: Path) -> str:
    """What ``--save`` stored: how many features were measured, how many keep a recommended strength, where, and
    how many recommended before lost theirs."""
    from millm.sae.cards import FEATURES_FILE

    lost = sum(s.recommended is None and s.feature in measured for s in found.swept)
    cleared = f"; {lost} recommended before lost theirs" if lost else ""
    return (f"held-out measures saved for {len(found.swept)} features ({len(found.steers)} recommended) in "
            f"{folder / FEATURES_FILE}{cleared}")


def screen(
    sae: SaeOption = None,
    layer: LayerOption = None,
    prompts: Annotated[int, typer.Option(help="Calibration prompts per sampled sweep (1-20).")] = 16,
    held_out: Annotated[int, typer.Option(help="Held-out prompts each chosen strength is verified on (1-16).")
                        ] = 16,
    tokens: Annotated[int, typer.Option(help="Tokens per answer.")] = 24,
    limit: Annotated[int | None, typer.Option(min=1, help="Sweep at most this many features, the highest "
                                                          "estimates first.")] = None,
    first: Annotated[int | None, typer.Option(min=1, help="Screen only the first N labelled features.")] = None,
    again: Annotated[bool, typer.Option(help="Sweep features measured before too (default: a feature whose "
                                             "features.jsonl row has a held-out measure on the current prompt "
                                             "set is not swept again).")] = False,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the swept features as JSON.")] = False,
    save: Annotated[bool, typer.Option(help="Store each swept feature's held-out measure (and its recommended "
                                            "strength, when the held-out interval reaches the target) in the "
                                            "SAE's features.jsonl as each batch is swept (writable SAE folders "
                                            "only).")] = False,
    model: Annotated[str | None, typer.Option(help="Model id (default: the configured one).")] = None,
) -> None:
    """Screen every labelled feature of an SAE for steering: a cheap teacher-forced estimate of how much each
    raises the chance of mentioning its label's words, then a sampled sweep (as ``steer sweep``) of those
    the estimate picks; prints the features that steer, with their recommended strengths."""
    from millm.research.measure import check_engine
    from millm.research.saving import save_measured, saveable
    from millm.research.screen import screen_sae
    from millm.sae.cards import folder_of

    check_seed(seed)
    service = steering_service()
    engine = engine_for(model)
    target = steerable(engine)
    sae_id = sweep_sae(service, target, sae)
    folder = folder_of(service.sae(sae_id)["path"])
    index = service.label_index(sae_id)
    labels = _labels_to_screen(index.labels, first, sae_id)
    if save:
        saveable(folder)  # refused before the screen runs, not after
    check_engine(engine)
    with err.status(f"screening {len(labels)} labelled features of {sae_id} ...") as status:
        def progress(stage: str, done: int, total: int) -> None:
            status.update(f"screening {sae_id}: {stage} {done}/{total}")

        def keep(batch: list[Screened]) -> None:  # each batch saved as it is swept: an interrupt keeps them
            save_measured(folder, _measured(batch))

        found = screen_sae(service, engine, sae_id, labels, prompts=prompts, held_out=held_out, tokens=tokens,
                           seed=seed, limit=limit, layer=layer, on_progress=progress,
                           on_swept=keep if save else None, skip=() if again else remeasured(index.held))
    if as_json:
        out.print(_screen_json(sae_id, found), markup=False)
    else:
        out.print(_screen_table(sae_id, found))
    if save:
        err.print(_saved_line(found, index.measured, folder), markup=False)


def remeasured(held: Mapping[int, HeldOut]) -> set[int]:
    """The features already measured on the current prompt set (what a screen skips, so a run resumes)."""
    from millm.research.prompt_sets import PROMPT_SET

    return {i for i, h in held.items() if h.prompt_set == PROMPT_SET}


def register(steer_app: typer.Typer) -> None:
    """Add ``sweep`` and ``screen`` to ``millm steer``."""
    steer_app.command("sweep")(reports_errors(sweep))
    steer_app.command("screen")(reports_errors(screen))
