"""Learning steering vectors for the management API: a POST /api/vectors/learn body checked whole before any
model work (``plan_of``), the job table GET /api/vectors/jobs reads, and the job itself (``run_job``), whose
model steps run as engine jobs on the engine thread (``EngineWorker.call``), serial with every request the
server serves, on the engine the server serves."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from quart import current_app

from millm.engine.base import Engine
from millm.errors import FieldNotHonoured, InvalidParameter, MillmError, ModelNotLoaded
from millm.requests.validation import SEED_MAX, check_int
from millm.server.state import services
from millm.vectors import EXAMPLES as DEFAULT_EXAMPLES
from millm.vectors import catalog
from millm.vectors.files import set_name
from millm.vectors.learn import (
    EXAMPLE_TOKENS,
    Examples,
    check_choices,
    check_negatives,
    default_layer,
    generated,
    learn,
    parse_layers,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

JOBS_KEPT = 64  # the job table keeps the newest jobs; a queued or running one is never dropped
MAX_CONCEPTS, MAX_TEXTS, MAX_TEXT_CHARS, MAX_CONCEPT_CHARS = 64, 1024, 8192, 256
EXAMPLES = (2, 1024, DEFAULT_EXAMPLES)  # generated examples of each side: low, high, default
TOKENS = (4, 256, EXAMPLE_TOKENS)  # tokens per generated example
EXTENSION = "millm.vector_jobs"  # where an app keeps its job table


class LearnJobRunning(MillmError):
    """Only one learning job runs at a time."""

    status, type, code = 409, "invalid_request_error", "learn_job_running"


class JobNotFound(MillmError):
    status, type, code = 404, "invalid_request_error", "job_not_found"


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

    def source(self) -> dict[str, object]:
        if self.texts is not None:
            return {"given": "POST /api/vectors/learn"}
        return {"concepts": list(self.concepts), "seed": self.seed, "tokens": self.tokens,
                "negatives": self.negatives}

    @property
    def names(self) -> list[str]:
        return [set_name(self.name, layer, self.layers) for layer in self.layers]


@dataclass(eq=False)
class Job:
    id: str
    plan: Plan
    created: float = field(default_factory=time.time)
    status: str = "queued"  # queued | running | succeeded | failed
    progress: str = "waiting for the engine"
    finished: float | None = None
    error: dict[str, Any] | None = None

    @property
    def active(self) -> bool:
        return self.status in ("queued", "running")

    def view(self) -> dict[str, Any]:
        plan = self.plan
        return {"id": self.id, "object": "vectors.learn_job", "status": self.status, "progress": self.progress,
                "name": plan.name, "layers": list(plan.layers), "method": plan.method, "position": plan.position,
                "created": int(self.created), "finished": int(self.finished) if self.finished else None,
                "vector_sets": plan.names if self.status == "succeeded" else None, "error": self.error}


class Jobs:
    """The newest ``JOBS_KEPT`` jobs by id; at most one of them queued or running."""

    def __init__(self) -> None:
        self.table: OrderedDict[str, Job] = OrderedDict()

    def start(self, plan: Plan) -> Job:
        running = next((j for j in self.table.values() if j.active), None)
        if running is not None:
            raise LearnJobRunning(f"Learning job {running.id} ('{running.plan.name}') is {running.status}; one job "
                                  f"learns at a time: retry once GET /api/vectors/jobs/{running.id} says it "
                                  "ended.", param="name")
        job = Job(f"job_{uuid.uuid4().hex[:24]}", plan)
        self.table[job.id] = job
        while len(self.table) > JOBS_KEPT:
            oldest = next(j for j in self.table.values() if not j.active)
            del self.table[oldest.id]
        return job

    def get(self, job_id: str) -> Job:
        job = self.table.get(job_id)
        if job is None:
            raise JobNotFound(f"No learning job has id '{job_id}' (the newest {JOBS_KEPT} are kept); see GET "
                              "/api/vectors/jobs.", param="id")
        return job


def jobs() -> Jobs:
    """The current app's job table."""
    table: Jobs = current_app.extensions.setdefault(EXTENSION, Jobs())
    return table


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
    return Plan(name, tuple(layers), method, position, texts=texts, **extra), engine


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
    words = tuple(_strings(data, "concepts", MAX_CONCEPTS, MAX_CONCEPT_CHARS))
    if not all(w.strip() for w in words):
        raise InvalidParameter("'concepts' must not hold a blank word.", param="concepts")
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


async def run_job(job: Job, engine: Engine, release: Callable[[], None]) -> None:
    """Generate the examples (for concepts), read them and store the set: each model step an engine job on
    the engine thread, beside the requests being served."""
    svc, plan = services(), job.plan

    def progress(what: str) -> None:
        job.progress = what

    def on_engine(fn: Callable[[], T]) -> Callable[[], T]:
        def step() -> T:
            if svc.manager.engine is not engine:
                raise ModelNotLoaded(f"'{engine.model_id}' was unloaded before job {job.id} ended; learn again.")
            job.status = "running"
            return fn()
        return step

    def write() -> Examples:
        writing = (f"the model writes {plan.count} answers about {', '.join(plan.concepts)} and {plan.count} "
                   f"{'about other topics' if plan.negatives == 'topics' else 'to neutral prompts'}")
        progress(writing)
        return generated(engine, plan.concepts, plan.count, plan.seed, plan.tokens, plan.negatives,
                         lambda done: progress(f"{writing} ({done} of {2 * plan.count} written)"))

    try:
        examples = plan.texts if plan.texts is not None else await svc.worker.call(on_engine(write))
        sets = await svc.worker.call(on_engine(lambda: learn(
            engine, plan.name, plan.layers, examples, method=plan.method, position=plan.position,
            source=plan.source(), progress=progress)))
        progress("storing the vector sets")
        await asyncio.to_thread(catalog.store_all, svc.steering, svc.settings.home, sets)
        job.status, job.progress = "succeeded", f"stored vector sets {', '.join(plan.names)}"
    except MillmError as exc:
        job.status, job.error, job.progress = "failed", exc.body(), f"failed: {exc.message}"
    except asyncio.CancelledError:
        job.status, job.progress = "failed", "cancelled: the server stopped"
        job.error = MillmError("The server stopped before the job ended.").body()
        raise
    except Exception as exc:
        log.exception("learning job %s failed", job.id)
        job.status, job.error, job.progress = "failed", MillmError(f"Internal error: {exc}").body(), "failed"
    finally:
        job.finished = time.time()
        release()
