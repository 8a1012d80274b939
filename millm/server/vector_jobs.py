"""Learning steering vectors for the management API: a POST /api/vectors/learn body checked whole before any
model work (``plan_of``), the job table GET /api/vectors/jobs reads (``jobs``: a ``millm.server.jobs`` table kept
in the SQLite store, so a restart lists it), and the job's work (``start``).

A job's model work runs in slices (``millm.vectors.learn``: a few answers written, or a few texts read, per
slice), each an engine job on the engine thread (``millm.server.slices``), so a request or an unload waiting for
the engine gets its turn between two; within a slice the decode loop runs the queued commands and checks the
job's ``StepControl`` at every step. Stopping that control ends the job where it is, storing nothing: ``DELETE
/api/vectors/jobs/{id}`` (``Table.cancel``), or an unload past its graceful timeout (the decode driver's
``Admitted.cancel_all``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from millm.engine.base import Engine
from millm.errors import FieldNotHonoured, InvalidParameter, MillmError, ModelNotLoaded
from millm.requests.validation import SEED_MAX, check_int
from millm.sae.vector_sets import VectorSet, set_name
from millm.server import jobs as job_tables
from millm.server.jobs import Job, Kind, Table
from millm.server.slices import Slices, start_on_engine, store
from millm.server.state import services
from millm.vectors import EXAMPLES as DEFAULT_EXAMPLES
from millm.vectors import catalog
from millm.vectors.learn import (
    EXAMPLE_TOKENS,
    Examples,
    check_choices,
    check_concepts,
    check_negatives,
    default_layer,
    generated,
    learn,
    parse_examples,
    parse_layers,
)

MAX_CONCEPTS, MAX_TEXTS, MAX_TEXT_CHARS, MAX_CONCEPT_CHARS = 64, 1024, 8192, 256
EXAMPLES = (2, 1024, DEFAULT_EXAMPLES)  # generated examples of each side: low, high, default
TOKENS = (4, 256, EXAMPLE_TOKENS)  # tokens per generated example


class LearnJobRunning(MillmError):
    """Only one learning job runs at a time."""

    status, type, code = 409, "invalid_request_error", "learn_job_running"


@dataclass(frozen=True)
class Plan:
    """A learning request, checked whole: generated examples (``concepts``) or given ones (``texts``)."""

    name: str
    layers: tuple[int, ...]
    method: str
    position: str
    negatives: str = "topics"
    concepts: tuple[str, ...] = ()
    count: int = EXAMPLES[2]
    tokens: int = TOKENS[2]
    seed: int = 0
    texts: Examples | None = None
    files: tuple[str, ...] = ()  # the uploaded files the texts came from

    def source(self) -> dict[str, object]:
        if self.texts is not None:
            return {"given": "POST /api/vectors/learn", **({"files": list(self.files)} if self.files else {})}
        return {"concepts": list(self.concepts), "seed": self.seed, "tokens": self.tokens,
                "negatives": self.negatives}

    @property
    def names(self) -> list[str]:
        return [set_name(self.name, layer, self.layers) for layer in self.layers]


def fields_of(plan: Plan) -> dict[str, Any]:
    """A learning job's own record: what it learns, and the sets it stores."""
    return {"name": plan.name, "layers": list(plan.layers), "method": plan.method, "position": plan.position,
            "planned": plan.names}


def view(job: Job) -> dict[str, Any]:
    """A learning job as the API shows it (its sets' names once it succeeded)."""
    f = job.fields
    return {"id": job.id, "object": "vectors.learn_job", "status": job.status, "progress": job.progress,
            "name": f["name"], "layers": list(f["layers"]), "method": f["method"], "position": f["position"],
            "created": int(job.created), "finished": int(job.finished) if job.finished else None,
            "vector_sets": list(f.get("planned") or ()) if job.status == "succeeded" else None, "error": job.error}


KIND = Kind("vectors.learn", "learning job", "/api/vectors/jobs", "job_", LearnJobRunning, param="name",
            again="Learn again.", about=lambda job: f" ('{job.fields['name']}')",
            undo=lambda job: (" (remove the sets it stored with DELETE /api/vectors/{name}: "
                              f"{', '.join(job.fields.get('planned') or ())})"))


def jobs() -> Table:
    """The current app's learning jobs (read from the store the first time it is asked for)."""
    return job_tables.table(KIND, store)


def _strings(data: dict[str, Any], key: str, most: int, chars: int) -> list[str]:
    """``data[key]``: 1 to ``most`` strings of at most ``chars`` characters, not all blank."""
    value = data[key]
    if not value or len(value) > most:
        raise InvalidParameter(f"'{key}' must hold 1 to {most} strings, got {len(value)}.", param=key)
    for i, text in enumerate(value):
        if len(text) > chars:
            raise InvalidParameter(f"'{key}.{i}' is {len(text)} characters; at most {chars}.", param=f"{key}.{i}")
    if not any(t.strip() for t in value):
        raise InvalidParameter(f"Every string of '{key}' is blank.", param=key)
    return value


def learning_engine() -> Engine:
    """The loaded model, which must read its residual stream (transformers): the refusals every /api route
    and the engine itself give."""
    manager = services().manager
    manager.check_not_busy()
    if manager.engine is None:
        raise ModelNotLoaded("No model is loaded; load a transformers model to learn a steering vector.")
    if not manager.engine.capabilities.reads:
        raise FieldNotHonoured(f"Learning a steering vector reads the residual stream: it needs a transformers "
                               f"model ('{manager.engine.model_id}' runs on {manager.engine.engine_name}).",
                               param="model")
    return manager.engine


async def plan_of(data: dict[str, Any]) -> tuple[Plan, Engine]:
    """The body checked whole, and the engine it runs on: every refusal comes before any model work."""
    method, position = data.get("method", "diffmean"), data.get("position", "mean")
    check_choices(method, position)
    data, files = uploaded(data)
    concepts = check_sources(*(data.get(k) for k in ("concepts", "positive", "negative")))
    extra = generated_examples(data) if concepts is not None else {}
    texts = given_examples(data, method) if concepts is None else None
    name = await asyncio.to_thread(catalog.check_new_name, services().steering, data["name"])
    engine = learning_engine()
    target = engine.steering_target()
    n_layers = target.steering.n_layers if target is not None else 0
    layers = layers_of(data.get("layer"), n_layers)
    for at in layers:
        await asyncio.to_thread(catalog.check_new_name, services().steering, set_name(name, at, layers))
    return Plan(name, tuple(layers), method, position, texts=texts, files=files, **extra), engine


def uploaded(data: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``data`` with each ``positive_file``/``negative_file`` (``{"name", "text"}``: a file the console's user
    picked) read into its side's texts by the rule ``millm vectors learn --positive FILE`` reads a file with; and
    the files' names."""
    out, names = dict(data), []
    for side in ("positive", "negative"):
        upload = out.pop(f"{side}_file", None)
        if upload is None:
            continue
        if side in out:
            raise InvalidParameter(f"Give '{side}' or '{side}_file', not both.", param=f"{side}_file")
        out[side] = parse_examples(upload["text"].encode(), upload["name"], f"{side}_file")
        names.append(upload["name"])
    return out, tuple(names)


def check_sources(concepts: Any, positive: Any, negative: Any) -> Any:
    """The examples come from ``concepts`` or from both ``positive`` and ``negative`` texts, one way only;
    returns ``concepts``."""
    if concepts is not None and (positive is not None or negative is not None):
        raise InvalidParameter("Give 'concepts', or 'positive' and 'negative', not both.", param="concepts")
    if concepts is None and (positive is None or negative is None):
        missing = "negative" if positive is not None else "positive" if negative is not None else "concepts"
        raise InvalidParameter("Give 'concepts' (words the model writes about), or both 'positive' and 'negative' "
                               "(example texts).", param=missing)
    return concepts


def generated_examples(data: dict[str, Any]) -> dict[str, Any]:
    """A body's asks for examples the model writes (``concepts``), checked: the plan's fields for them."""
    words = tuple(check_concepts(_strings(data, "concepts", MAX_CONCEPTS, MAX_CONCEPT_CHARS)))
    negatives = data.get("negatives", "topics")
    check_negatives(negatives)
    return {"concepts": words, "negatives": negatives,
            "count": check_int("examples", data.get("examples", EXAMPLES[2]), low=EXAMPLES[0], high=EXAMPLES[1]),
            "tokens": check_int("tokens", data.get("tokens", TOKENS[2]), low=TOKENS[0], high=TOKENS[1]),
            "seed": check_int("seed", data.get("seed", 0), low=0, high=SEED_MAX)}


def given_examples(data: dict[str, Any], method: str) -> Examples:
    """A body's ``positive`` and ``negative`` texts, checked (no generation fields beside them; PCA needs two
    non-blank texts a side)."""
    for key in ("examples", "tokens", "seed", "negatives"):
        if key in data:
            raise InvalidParameter(f"'{key}' is for generated examples ('concepts'); the 'positive' and "
                                   "'negative' texts given are the examples.", param=key)
    texts = Examples(_strings(data, "positive", MAX_TEXTS, MAX_TEXT_CHARS),
                     _strings(data, "negative", MAX_TEXTS, MAX_TEXT_CHARS))
    if method == "pca":
        for key, side in (("positive", texts.positive), ("negative", texts.negative)):
            if sum(1 for t in side if t.strip()) < 2:
                raise InvalidParameter(f"PCA needs at least 2 non-blank '{key}' texts.", param=key)
    return texts


def layers_of(value: Any, n_layers: int) -> list[int]:
    """``layer``: absent (the default layer), a layer, a range string ("8-12") or a list of either (the body's
    schema has checked the types)."""
    if value is None:
        return [default_layer(n_layers)]
    return parse_layers(value if isinstance(value, list) else [value], n_layers)


async def start(plan: Plan, engine: Engine) -> Job:
    """Start learning ``plan`` on ``engine`` in the background (``start_on_engine``): generate the examples (for
    concepts), read them, and store the sets only if the job was not stopped meanwhile, all or none
    (``catalog.store_all``)."""
    svc = services()

    def program(job: Job, run: Slices) -> list[VectorSet]:
        examples = plan.texts
        if examples is None:
            writing = (f"the model writes {plan.count} answers about {', '.join(plan.concepts)} and {plan.count} "
                       f"{'about other topics' if plan.negatives == 'topics' else 'to neutral prompts'}")
            job.say(writing)
            examples = generated(engine, plan.concepts, plan.count, plan.seed, plan.tokens, plan.negatives,
                                 lambda done: job.say(f"{writing} ({done} of {2 * plan.count} written)"),
                                 run=run, control=run.control)
        return learn(engine, plan.name, plan.layers, examples, method=plan.method, position=plan.position,
                     source=plan.source(), progress=job.say, run=run, control=run.control)

    def keep(job: Job, sets: list[VectorSet]) -> str:
        job.say("storing the vector sets")
        catalog.store_all(svc.steering, svc.settings.home, sets)
        return f"stored vector sets {', '.join(plan.names)}"

    return await start_on_engine(jobs(), fields_of(plan), engine, program, keep)
