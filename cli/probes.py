"""``millm probes``: probes learned from examples (learn), listed, shown (with a histogram of the held-out scores),
removed, and exchanged as JSON documents (export, import). ``millm serve`` serves them: POST
/api/probes/{name}/attach, or a request's ``probes`` field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from cli.common import check_seed, engine_for, out, reports_errors
from cli.vectors import _check_sources, _read_examples
from millm.config import get_settings
from millm.paths import output_file, user_path

probes_app = typer.Typer(help="Probes: linear read-outs with a calibrated operating point; learn, list, show, "
                              "remove, export and import.", no_args_is_help=True)
EXAMPLES = 48  # generated examples of each side by default (a third held out for the operating point)


def _figures(doc: dict) -> str:
    f = doc["figures"]
    return (f"held-out AUROC {f['auroc']:.3f}, recall {f['recall']:.0%} at FPR {f['fpr']:.1%} (target "
            f"{f['target_fpr']:.1%}) on {f['held_out']['positive']} + {f['held_out']['negative']} held-out examples "
            f"(trained on {f['train']['positive']} + {f['train']['negative']})")


@probes_app.command("learn")
@reports_errors
def learn(name: Annotated[str, typer.Argument(help="The probe's name.")],
          concept: Annotated[list[str] | None, typer.Option(help="A word the model is asked to write about for the "
                                                                 "positive examples (repeatable).")] = None,
          positive: Annotated[Path | None, typer.Option(help="Positive examples: one text per line, or JSONL chat "
                                                             "messages (the last message is read).")] = None,
          negative: Annotated[Path | None, typer.Option(help="Negative examples, as --positive.")] = None,
          layer: Annotated[int | None, typer.Option(help="The layer whose output it reads (default: 47% of the "
                                                         "model's depth, 14 of 30).")] = None,
          method: Annotated[str, typer.Option(help="diffmean or logreg.")] = "diffmean",
          aggregation: Annotated[str, typer.Option(help="max, mean, last or rolling_mean over the positions "
                                                        "read.")] = "max",
          window: Annotated[int | None, typer.Option(help="A rolling_mean's window in response tokens (default "
                                                          "8).")] = None,
          span: Annotated[str, typer.Option(help="The positions read: response, prompt or both.")] = "response",
          target_fpr: Annotated[float, typer.Option(help="The false-positive rate the threshold is cut at on the "
                                                         "held-out negatives, in (0, 1).")] = 0.01,
          examples: Annotated[int, typer.Option(min=3, max=1024, help="Generated examples of each side.")] = EXAMPLES,
          tokens: Annotated[int, typer.Option(min=4, max=256, help="Tokens per generated example.")] = 48,
          seed: Annotated[int, typer.Option(help="Sampling seed of the examples, and of the held-out split.")] = 0,
          model: Annotated[str | None, typer.Option(help="Model (default: the configured one).")] = None) -> None:
    """Learn a probe at LAYER from the model's own answers about --concept (kept by mention, against its answers
    about other topics) or from example files; a third of each side is held out, the threshold cut on the
    held-out negatives at --target-fpr; prints the held-out AUROC, recall and realised FPR, and stores it."""
    from millm.probes import catalog
    from millm.probes.learn import check_options
    from millm.probes.learn import learn as learn_probe
    from millm.probes.probe import identity
    from millm.vectors.learn import default_layer, generated

    check_seed(seed)
    window = check_options(method, aggregation, span, target_fpr, window)
    home = get_settings().home
    catalog.check_new(home, name)  # before any model work
    _check_sources(concept, positive, negative)
    files = _read_examples(positive, negative)
    engine = engine_for(model)
    if files is None:
        assert concept is not None
        out.print(f"the model writes {examples} answers about {', '.join(concept)} and {examples} about other "
                  "topics")
        files = generated(engine, concept, examples, seed, tokens)
        source: dict[str, object] = {"concepts": list(concept), "tokens": tokens}
    else:
        source = {"positive": str(positive), "negative": str(negative)}
    at = layer if layer is not None else default_layer(identity(engine).layers)
    probe = learn_probe(engine, name, files, at, method=method, aggregation=aggregation, span=span,
                        target_fpr=target_fpr, seed=seed, source=source, window=window)
    catalog.save(home, probe)
    out.print(f"probe {name}: {method} at layer {at}, {aggregation} over the {span}, threshold "
              f"{probe.threshold:.4g}; {_figures(probe.document())}")


@probes_app.command("list")
@reports_errors
def list_probes(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Stored probes: layer, method, aggregation, threshold, held-out figures, and whether each is attached."""
    from millm.probes import catalog

    home = get_settings().home
    attached = catalog.attached(home)
    rows = [{**catalog.load(home, n).summary(), "attached": attached.get(n)} for n in catalog.names(home)]
    if as_json:
        out.print(json.dumps(rows, indent=2), markup=False)
        return
    table = Table("name", "layer", "method", "aggregation", "threshold", "AUROC", "recall", "FPR", "model",
                  "attached")
    for r in rows:
        f = r["figures"]
        table.add_row(r["name"], str(r["layer"]), r["method"], f"{r['aggregation']}/{r['span']}",
                      f"{r['threshold']:.4g}", f"{f['auroc']:.3f}", f"{f['recall']:.0%}", f"{f['fpr']:.1%}",
                      r["model"]["id"], (r["attached"] or {}).get("action", ""))
    out.print(table)


@probes_app.command("show")
@reports_errors
def show(name: str,
         png: Annotated[Path | None, typer.Option("--out", help="Write a PNG histogram of the held-out scores "
                                                               "(positives above, negatives below, the threshold "
                                                               "a grey line) here.")] = None) -> None:
    """A probe's operating point and the evidence for it."""
    from millm.probes import catalog
    from millm.probes.histogram import write_histogram

    target = output_file(png, "--out") if png is not None else None
    probe = catalog.load(get_settings().home, name)
    doc = probe.summary()
    out.print(f"{name}: {probe.method} at layer {probe.layer} of {probe.model.describe()}", markup=False)
    out.print(f"  {probe.aggregation} over the {probe.span}, threshold {probe.threshold:.6g}", markup=False)
    out.print(f"  {_figures(doc)}", markup=False)
    for side in ("positive", "negative"):
        scores = sorted(probe.scores.get(side, []))
        if scores:
            out.print(f"  held-out {side} scores: {scores[0]:.4g} to {scores[-1]:.4g} (median "
                      f"{scores[len(scores) // 2]:.4g})", markup=False)
    if target is not None:
        out.print(f"histogram written to {write_histogram(target, probe)}", markup=False)


@probes_app.command("rm")
@reports_errors
def rm(name: str) -> None:
    """Remove a probe (and its attachment)."""
    from millm.probes import catalog

    catalog.remove(get_settings().home, name)
    out.print(f"removed probe {name}")


@probes_app.command("export")
@reports_errors
def export(name: str, file: Annotated[Path, typer.Argument(help="The JSON document to write.")]) -> None:
    """Write a probe as one JSON document, its direction inline (what `millm probes import` reads)."""
    from millm.probes import catalog

    target = output_file(file, "FILE")
    target.write_text(json.dumps(catalog.load(get_settings().home, name).document()))
    out.print(f"probe {name} written to {target}", markup=False)


@probes_app.command("import")
@reports_errors
def import_file(file: Annotated[Path, typer.Argument(help="A probe document (`millm probes export`).")],
                name: Annotated[str | None, typer.Option(help="Store it under this name.")] = None,
                overwrite: Annotated[bool, typer.Option(help="Replace a probe of that name.")] = False) -> None:
    """Store a probe document."""
    from millm.probes import catalog
    from millm.sae.files import read_capped

    path = user_path(file)
    probe = catalog.read(read_capped(path, str(file), catalog.MAX_BYTES, "FILE"), str(file), name)
    catalog.save(get_settings().home, probe, overwrite)
    out.print(f"imported probe {probe.name} ({probe.method} at layer {probe.layer}, model {probe.model.id})",
              markup=False)
