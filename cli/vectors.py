"""``millm vectors``: steering vectors learned from examples (learn, list, show, rm), and exchanged with llama.cpp
as control-vector GGUF files (export, import). A vector set registers as an SAE of its vectors, so
``--sae NAME``, ``--steer NAME=8``, profiles and the API take it as they take an SAE."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli.common import check_seed, engine_for, err, out, reports_errors, steerable, steering_service
from millm.config import get_settings
from millm.errors import InvalidParameter
from millm.paths import output_file, user_path
from millm.vectors import EXAMPLES

if TYPE_CHECKING:
    from millm.engine.base import Engine
    from millm.sae.vector_sets import VectorSet
    from millm.vectors.learn import Examples

vectors_app = typer.Typer(help="Steering vectors learned from examples: learn, list, show, remove; export and "
                               "import llama.cpp control vectors.", no_args_is_help=True)
PROMOTED = 10  # tokens `show` lists as a vector's logit lens


def _check_sources(concept: list[str] | None, positive: Path | None, negative: Path | None) -> None:
    """The examples come from one source: --concept words, or both --positive and --negative files."""
    from millm.vectors.learn import check_concepts

    if concept and (positive or negative):
        raise InvalidParameter("Give --concept, or --positive and --negative, not both.", param="concept")
    if not concept and not (positive and negative):
        raise InvalidParameter("Give --concept WORD, or both --positive FILE and --negative FILE.", param="concept")
    if concept:
        check_concepts(concept, "concept")


def _read_examples(positive: Path | None, negative: Path | None) -> Examples | None:
    """The example files, read and checked; None when the examples are to be generated."""
    from millm.vectors.learn import Examples, read_file

    if not (positive and negative):
        return None
    return Examples(read_file(user_path(positive), "positive", positive),
                    read_file(user_path(negative), "negative", negative))


@vectors_app.command("learn")
@reports_errors
def learn(name: Annotated[str, typer.Argument(help="The vector's name (what --steer NAME=S and profiles use).")],
          concept: Annotated[list[str] | None, typer.Option(help="A word the model is asked to write about for the "
                                                                 "positive examples (repeatable).")] = None,
          positive: Annotated[Path | None, typer.Option(help="Positive examples: one text per line, or JSONL chat "
                                                             "messages (the last message is read).")] = None,
          negative: Annotated[Path | None, typer.Option(help="Negative examples, as --positive.")] = None,
          layer: Annotated[list[str] | None, typer.Option(help="The layer whose output the vector steers: 10, a "
                                                               "range 8-12 or a list 8,10 (repeatable); one set per "
                                                               "layer, NAME-L{layer}, when several. Default: 47% "
                                                               "of the model's depth (14 of 30).")] = None,
          method: Annotated[str, typer.Option(help="diffmean or pca.")] = "diffmean",
          position: Annotated[str, typer.Option(help="mean (over the answer's tokens) or last.")] = "mean",
          negatives: Annotated[str, typer.Option(help="With --concept: topics (the same requests about other "
                                                      "topics) or neutral (answers to everyday prompts).")
                               ] = "topics",
          examples: Annotated[int, typer.Option(min=2, max=1024, help="Generated examples of each side.")] = EXAMPLES,
          tokens: Annotated[int, typer.Option(min=4, max=256, help="Tokens per generated example.")] = 48,
          seed: Annotated[int, typer.Option(help="Sampling seed of the generated examples.")] = 0,
          calibrate: Annotated[bool, typer.Option(help="End by calibrating each vector (`millm vectors calibrate`: "
                                                       "a strength chosen on the calibration prompts, verified on "
                                                       "the held-out prompts, stored). --no-calibrate skips it."
                                                  )] = True,
          model: Annotated[str | None, typer.Option(help="Model (default: the configured one).")] = None) -> None:
    """Learn a unit-norm steering vector at each LAYER from the model's own answers about --concept (against its
    answers about other topics), or from example files; store each and register it as a vector set; then
    calibrate each (a set learned from files names no concept: `millm vectors calibrate NAME --concept W`
    calibrates it afterwards)."""
    from millm.sae.vector_sets import set_name
    from millm.vectors import catalog
    from millm.vectors.learn import check_choices, check_negatives, default_layer, parse_layers

    check_seed(seed)
    check_choices(method, position)
    check_negatives(negatives)
    service = steering_service()
    catalog.check_new_name(service, name)  # before any model work
    _check_sources(concept, positive, negative)
    files = _read_examples(positive, negative)
    engine = engine_for(model)
    n_layers = steerable(engine).steering.n_layers
    layers = parse_layers(layer, n_layers) if layer else [default_layer(n_layers)]  # before the examples
    for at in layers:
        catalog.check_new_name(service, set_name(name, at, layers))
    sets, made = _learn_and_store(engine, name, layers, concept, files, method=method, position=position,
                                  negatives=negatives, examples=examples, tokens=tokens, seed=seed,
                                  file_source={"positive": str(positive), "negative": str(negative)})
    for vs in sets:
        out.print(f"vector set {vs.names[0]}: {vs.method} at layer {vs.layer} from {len(made.positive)} + "
                  f"{len(made.negative)} examples; steer it with --sae {vs.names[0]} --steer {vs.names[0]}=S")
    if calibrate and not concept:
        err.print(f"not calibrated: {', '.join(vs.names[0] for vs in sets)} learned from files name no concept; "
                  "calibrate with `millm vectors calibrate NAME --concept WORD`", markup=False)
    for vs in sets if calibrate and concept else ():
        calibrated(engine, vs.names[0])


def _learn_and_store(engine: Engine, name: str, layers: list[int], concept: list[str] | None,
                     files: Examples | None, *, method: str = "diffmean", position: str = "mean",
                     negatives: str = "topics", examples: int = EXAMPLES, tokens: int = 48, seed: int = 0,
                     file_source: dict[str, object] | None = None) -> tuple[list[VectorSet], Examples]:
    """The examples written about ``concept`` (or ``files``, read from ``file_source``), a set learned at each
    layer, stored and registered; progress bars on stderr."""
    from millm.vectors import catalog
    from millm.vectors.learn import generated
    from millm.vectors.learn import learn as learn_vectors

    service = steering_service()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as bar:
        if files is None:
            assert concept is not None
            writing = bar.add_task(f"writing answers about {', '.join(concept)} and "
                                   f"{'other topics' if negatives == 'topics' else 'neutral prompts'}",
                                   total=2 * examples)
            made = generated(engine, concept, examples, seed, tokens, negatives,
                             lambda done: bar.update(writing, completed=done))
            source: dict[str, object] = {"concepts": list(concept), "seed": seed, "tokens": tokens,
                                         "negatives": negatives}
        else:
            made = files
            source = dict(file_source or {})
        reading = bar.add_task("reading the examples", total=2 * len(layers))
        reads = iter(range(2 * len(layers)))  # learn reports each read as it starts

        def read(what: str) -> None:
            bar.update(reading, description=what, completed=next(reads, 2 * len(layers)))

        sets = learn_vectors(engine, name, layers, made, method=method, position=position, source=source,
                             progress=read)
        bar.update(reading, completed=2 * len(layers))
        catalog.store_all(service, get_settings().home, sets)
    return sets, made


def calibrated(engine: Engine, name: str, words: list[str] | None = None, seed: int = 0, prompts: int = 16,
               held_out: int = 16, tokens: int = 24) -> None:
    """Calibrate the set ``name`` (:func:`millm.vectors.calibrate.calibrate`), progress on stderr, and print each
    vector's verdict: its recommended strength with the held-out rate and interval, or that none is."""
    from millm.research.measure import check_engine
    from millm.vectors.calibrate import calibrate

    check_engine(engine)
    with err.status(f"calibrating {name} ...") as status:
        results = calibrate(steering_service(), engine, name, words or (), seed=seed, prompts=prompts,
                            held_out=held_out, tokens=tokens,
                            on_vector=lambda n, total: status.update(f"calibrating {name}: vector {n + 1}/{total} "
                                                                     "(calibration, then held-out prompts)"))
    for result in results:
        held = result.held_out
        verdict = (f"recommended strength {result.recommended:g} ({held.describe()})"
                   if result.recommended is not None and held is not None else
                   f"no recommended strength ({held.describe() if held else 'no strength mentions the concept'})")
        out.print(f"{result.label}: {verdict}; steer it with --sae {name} --steer {result.label}", markup=False)


@dataclass(frozen=True)
class ConceptSizes:
    """How ``--steer-concept`` learns and calibrates a vector: ``millm vectors learn``'s and ``calibrate``'s
    defaults."""

    examples: int = EXAMPLES
    tokens: int = 48
    prompts: int = 16
    held_out: int = 16
    calibration_tokens: int = 24


CONCEPT_SIZES = ConceptSizes()


def concept_set(word: str, model: str | None) -> str:
    """The vector set ``millm chat --steer-concept WORD`` steers with, ``concept-WORD``: the one stored and
    calibrated, else learned from the model's answers about WORD now (at the default layer, against other topics)
    and stored, and calibrated (so one stored but never calibrated, a run interrupted or ``--no-calibrate``, is
    calibrated now), with progress on stderr. Refused on an engine that cannot read activations and score
    answers (llama.cpp), saying why."""
    from millm.names import check_name
    from millm.sae.cards import held_out_measures
    from millm.vectors import catalog
    from millm.vectors.learn import check_concepts, default_layer

    [concept] = check_concepts([word], "steer_concept")
    name = check_name(f"concept-{'-'.join(concept.lower().split())}", "steer_concept")
    service = steering_service()
    stored = service.store.sae(name)
    if stored is not None and held_out_measures(stored["path"]):
        err.print(f"steering by the vector set {name} (learned before; `millm vectors rm {name}` forgets it)",
                  markup=False)
        return name
    engine = engine_for(model)
    caps = engine.capabilities
    if not (caps.reads and caps.scores and caps.steers):
        raise InvalidParameter(f"--steer-concept learns a vector from {engine.model_id}'s activations and calibrates "
                               f"it by scoring answers; {engine.engine_name} cannot read activations and score, so "
                               "it cannot make one: use a transformers model (the model id without :QUANT), or "
                               "steer with a vector set learned there (--sae NAME --steer NAME).",
                               param="steer_concept")
    sizes = CONCEPT_SIZES
    if stored is None:
        catalog.check_new_name(service, name)
        err.print(f"no vector set {name} yet: learning one from the model's answers about {concept}, then "
                  "calibrating it (stored for next time)", markup=False)
        _learn_and_store(engine, name, [default_layer(steerable(engine).steering.n_layers)], [concept], None,
                         examples=sizes.examples, tokens=sizes.tokens)
    else:
        err.print(f"the vector set {name} was learned before but never calibrated: calibrating it now (stored for "
                  "next time)", markup=False)
    calibrated(engine, name, prompts=sizes.prompts, held_out=sizes.held_out, tokens=sizes.calibration_tokens)
    return name


@vectors_app.command("calibrate")
@reports_errors
def calibrate_set(name: Annotated[str, typer.Argument(help="The vector set.")],
                  concept: Annotated[list[str] | None, typer.Option(help="A word that counts as mentioning the "
                                                                         "concept (repeatable; default: the ones "
                                                                         "the set was learned from).")] = None,
                  seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
                  prompts: Annotated[int, typer.Option(help="Calibration prompts (1-20).")] = 16,
                  held_out: Annotated[int, typer.Option(help="Held-out prompts (1-16).")] = 16,
                  tokens: Annotated[int, typer.Option(help="Tokens per answer.")] = 24,
                  model: Annotated[str | None, typer.Option(help="Model (default: the configured one).")] = None,
                  ) -> None:
    """Choose each vector's strength on the calibration prompts, verify it on the held-out prompts and store it
    (recommended only when the held-out 90% interval reaches the target), as `millm steer sweep --save` does."""
    from millm.vectors.catalog import record_of

    check_seed(seed)
    record_of(steering_service(), name)  # an unknown set is refused before the model loads
    calibrated(engine_for(model), name, concept, seed, prompts, held_out, tokens)


@vectors_app.command("list")
@reports_errors
def list_sets(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """The vector sets stored and registered, from the registry: a set whose files are damaged or gone is listed
    as unreadable, with why (``millm vectors rm`` removes it)."""
    from millm.vectors import catalog

    sets = catalog.vector_sets(steering_service())
    if as_json:
        out.print_json(json.dumps([{k: v for k, v in s.items() if k != "added"} for s in sets]))
        return
    table = Table("name", "vectors", "layer", "model", "method", "examples")
    for s in sets:
        table.add_row(s["id"], ", ".join(s["names"]), str(s["layer"]), s["model"],
                      s["method"] if s["readable"] else "[red]unreadable[/]",
                      f"{s['examples'].get('positive', 0)} + {s['examples'].get('negative', 0)}")
    out.print(table)
    for s in sets:
        if not s["readable"]:
            err.print(f"{s['id']}: unreadable: {s['problem']}", markup=False, highlight=False)


@vectors_app.command("show")
@reports_errors
def show(name: str, top: Annotated[int, typer.Option(min=1, max=50, help="Nearest SAE features shown.")] = 5) -> None:
    """One set: how it was made, its vectors' norms, the nearest features (cosine) of the registered SAEs at its
    layer, and the tokens it promotes through its model's unembedding (loads the model)."""
    from millm.sae.formats import load_sae
    from millm.vectors import catalog

    service = steering_service()
    record, vs = catalog.vector_set(service, name)
    meta = vs.meta()
    out.print(f"{name}: {meta['method']} at layer {vs.layer} of {vs.model} (d_model {vs.d_model}), "
              f"{meta['examples']} examples, position {vs.position}; sha256 {vs.sha256[:12]}")
    if vs.source:
        out.print(f"  source: {json.dumps(vs.source)}")
    for i, vector_name in enumerate(vs.names):
        out.print(f"  {vector_name}: norm {float(vs.vectors[i].norm()):.3f}")
    for other in service.store.saes():
        if other["format"] == "vectors" or other["layer_hint"] != vs.layer or other["d_in"] != vs.d_model:
            continue
        decoder = load_sae(other["path"]).sae.W_dec.float()
        cosines = (decoder / decoder.norm(dim=-1, keepdim=True).clamp_min(1e-12)) @ vs.vectors[0]
        labels = service.store.label_map(other["id"])
        best = cosines.topk(min(top, len(cosines)))
        shown = ", ".join(f'{int(f)} "{labels.get(int(f), "")}" {float(c):.2f}' for c, f in zip(best.values,
                                                                                             best.indices))
        out.print(f"  nearest features of {other['id']}: {shown}")
    out.print(f"  promotes: {promoted_tokens(vs)}")


def promoted_tokens(vs: VectorSet) -> str:
    """The tokens the set's first vector promotes read straight through its model's unembedding (the logit lens,
    no final norm), or why they cannot be read there."""
    from millm.errors import MillmError

    try:
        engine = engine_for(vs.model or None)
        logits = engine.unembed(vs.vectors[0])[:engine.vocab_size]
    except MillmError as exc:
        return f"not read ({exc.message})"
    best = logits.topk(min(PROMOTED, len(logits)))
    return ", ".join(f"{engine.token_text(int(t))!r} {float(v):.2f}" for v, t in zip(best.values, best.indices))


@vectors_app.command("rm")
@reports_errors
def rm(name: str) -> None:
    """Unregister a vector set and delete its stored folder."""
    from millm.vectors import catalog

    catalog.remove(steering_service(), get_settings().home, name)
    out.print(f"removed vector set {name}")


@vectors_app.command("export")
@reports_errors
def export(arguments: Annotated[list[str], typer.Argument(metavar="[NAME] FILE", help="The vector set and the file "
                                                          "to write; with --profile, the file alone.")],
           profile: Annotated[str | None, typer.Option(help="Export this profile's whole steering instead of a "
                                                             "vector set.")] = None,
           model: Annotated[str | None, typer.Option(help="With --profile: the model whose attached SAEs place its "
                                                          "entries (default: the profile's, else the configured "
                                                          "one).")] = None) -> None:
    """Write a vector set (at unit norm: llama.cpp scales it, `--control-vector-scaled FILE S`) or a profile's
    whole steering (its strengths included: `--control-vector FILE`) as a llama.cpp control-vector GGUF."""
    from millm.registry import resolve
    from millm.vectors import catalog, gguf

    wanted = 1 if profile else 2
    if len(arguments) != wanted:
        raise InvalidParameter("Give NAME FILE, or --profile PROFILE FILE." if not profile else
                               "With --profile, give the file alone.", param="file")
    file = output_file(arguments[-1], "file")
    service = steering_service()
    if profile:
        doc = service.profile_doc(profile)
        settings = get_settings()
        model_id = resolve(model or doc.model or settings.default_model, settings, paths=True).id
        directions = gguf.profile_directions(service, doc, model_id)
        gguf.write(file, directions, model_id)
        layers = ", ".join(f"direction.{layer}" for layer in sorted(directions))
        out.print(f"wrote {file}: profile {profile} as {layers}, its strengths included; llama.cpp applies it "
                  f"with --control-vector {file}")
        return
    _, vs = catalog.vector_set(service, arguments[0])
    gguf.write(file, gguf.set_directions(vs), vs.model)
    out.print(f"wrote {file}: vector set {vs.names[0]} as direction.{vs.layer} at unit norm; llama.cpp steers with "
              f"it at strength S with --control-vector-scaled {file} S")


@vectors_app.command("import")
@reports_errors
def import_file(file: Annotated[Path, typer.Argument(help="A llama.cpp control-vector GGUF (direction.N tensors).")],
                name: Annotated[str, typer.Argument(help="The set's name; a file of several layers makes one set "
                                                         "per layer, NAME-L{layer}.")],
                layer: Annotated[int | None, typer.Option(help="Import only this layer's direction, as NAME.")] = None,
                model: Annotated[str | None, typer.Option(help="The model the file steers (default: the configured "
                                                               "one); its layers and width are checked.")] = None
                ) -> None:
    """Import a llama.cpp control vector as vector sets: each direction at unit norm, the file's norm kept in its
    source (steer at that norm to reproduce the file at scale 1)."""
    from millm.names import check_name
    from millm.vectors import catalog, gguf

    check_name(name, "name")  # before the model loads
    path = user_path(file)
    service = steering_service()
    engine = engine_for(model)
    steering = steerable(engine).steering
    cv = gguf.read(path, steering.n_layers, steering.d_model, file)  # refusals name the file as given
    sets = gguf.imported_sets(cv, file, name, engine.model_id, layer)
    catalog.store_all(service, get_settings().home, sets)
    for vs in sets:
        out.print(f"vector set {vs.names[0]}: direction.{vs.layer} of {path} (norm {vs.source['norm']:.3f}); steer "
                  f"it with --sae {vs.names[0]} --steer {vs.names[0]}={vs.source['norm']:.3g} to match the file")
