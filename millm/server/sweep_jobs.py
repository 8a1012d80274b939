"""Strength sweeps as background jobs of the management API (``POST /api/sweeps``): the body checked whole before
any model work (:func:`plan_of`), the newest ``JOBS_KEPT`` jobs kept in memory (:class:`SweepJobs`; one runs at a
time), and the job itself (:func:`run_job`).

A job runs ``millm steer sweep``'s measure (``millm.research.sweep.run_sweep`` on a ``Measure``) against a feature
of an SAE or vector set attached on the server, so its answers are the ones ``/v1/chat/completions`` gives for the
same message, seed and steering, and its numbers are the CLI's for the same seed. Its model work runs in slices
(``millm.server.slices``): every engine call the measure makes (preparing, decoding a set of answers, scoring) is
one engine job, with requests served between two. The answers decoded are kept beside the sweep's points, so a
page can show each point's answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from quart import current_app

from millm.engine.base import Engine, StepControl
from millm.engine.events import Delta, Event
from millm.engine.params import GenerationRequest, Prompt
from millm.engine.plan import Plan
from millm.engine.scoring import ScoreRequest, ScoreResult
from millm.errors import InvalidParameter, MillmError, ModelNotLoaded
from millm.requests.validation import SEED_MAX, check_int
from millm.research.figures import sweep_figure
from millm.research.measure import HELD_OUT_PROMPTS, MAX_NEW_TOKENS, NEUTRAL_PROMPTS, SEED, Measure, check_engine
from millm.research.sweep import MAX_TOKENS, STRENGTHS, check_strengths, run_sweep
from millm.research.words import label_words
from millm.sae.cards import check_index
from millm.server.slices import Slices
from millm.server.state import services
from millm.steering.scope import ALL, Scope, parse_scope
from millm.vectors.learn import stopped

log = logging.getLogger(__name__)

JOBS_KEPT = 64  # the newest jobs kept; a queued or running one is never dropped
EXTENSION = "millm.sweep_jobs"  # where an app keeps its job table
MAX_CONCEPTS, MAX_CONCEPT_CHARS = 64, 256
PROMPTS = 16  # calibration prompts by default (``millm steer sweep --prompts``); held-out: all of them


class SweepJobRunning(MillmError):
    """Only one sweep runs at a time."""

    status, type, code = 409, "invalid_request_error", "sweep_job_running"


class SweepNotFound(MillmError):
    status, type, code = 404, "invalid_request_error", "sweep_not_found"


class SweepFinished(MillmError):
    """A sweep that ended cannot be cancelled."""

    status, type, code = 409, "invalid_request_error", "sweep_finished"


class SweepCancelled(MillmError):
    """Why a sweep cancelled by DELETE /api/sweeps/{id} ended (its record's error)."""

    status, type, code = 409, "invalid_request_error", "sweep_cancelled"


@dataclass(frozen=True)
class SweepPlan:
    """A sweep request, checked whole: a feature of an attached SAE (or vector set) at ``layer``, the concept
    ``words`` its answers are searched for, and the measure's sizes."""

    sae: str
    layer: int
    feature: int
    label: str
    words: tuple[str, ...]
    strengths: tuple[float, ...] = STRENGTHS
    prompts: int = PROMPTS
    held_out: int = len(HELD_OUT_PROMPTS)
    tokens: int = MAX_NEW_TOKENS
    seed: int = SEED
    scope: Scope = ALL

    def view(self) -> dict[str, Any]:
        return {"sae": self.sae, "layer": self.layer, "feature": self.feature, "label": self.label,
                "concepts": list(self.words), "strengths": list(self.strengths), "prompts": self.prompts,
                "held_out": self.held_out, "tokens": self.tokens, "seed": self.seed, "scope": self.scope}


@dataclass(eq=False)
class SweepJob:
    """A sweep's record (what the API shows) and, while it runs, the ``control`` that stops it."""

    plan: SweepPlan
    id: str = field(default_factory=lambda: f"sweep_{uuid.uuid4().hex[:24]}")
    created: float = field(default_factory=time.time)
    status: str = "queued"  # queued | running | succeeded | failed | cancelled
    progress: str = "waiting for the engine"
    finished: float | None = None
    error: dict[str, Any] | None = None
    result: dict[str, Any] | None = None  # the sweep as ``millm steer sweep --json`` prints it
    answers: dict[float, list[str]] = field(default_factory=dict)  # the calibration answers, by strength
    held_answers: dict[float, list[str]] = field(default_factory=dict)  # the held-out answers, by strength
    control: StepControl | None = None

    @property
    def active(self) -> bool:
        return self.status in ("queued", "running")

    def end(self, status: str, progress: str, error: MillmError | None = None) -> None:
        """Record how it ended; a job cancelled already stays so."""
        if self.status == "cancelled":
            return
        self.status, self.progress, self.finished = status, progress, time.time()
        self.error = error.body() if error is not None else None

    def view(self) -> dict[str, Any]:
        done = self.status == "succeeded"
        return {"id": self.id, "object": "research.sweep_job", "status": self.status, "progress": self.progress,
                "created": int(self.created), "finished": int(self.finished) if self.finished else None,
                "request": self.plan.view(), "prompts": list(NEUTRAL_PROMPTS[:self.plan.prompts]),
                "held_out_prompts": list(HELD_OUT_PROMPTS[:self.plan.held_out]),
                "result": self.result if done else None,
                "figure": sweep_figure(self.result) if done and self.result is not None else None,
                "answers": _by_strength(self.answers) if done else None,
                "held_out_answers": _by_strength(self.held_answers) if done else None, "error": self.error}


def _by_strength(answers: dict[float, list[str]]) -> list[dict[str, Any]]:
    return [{"strength": s, "answers": a} for s, a in sorted(answers.items())]


class SweepJobs:
    """The newest ``JOBS_KEPT`` sweeps by id (in this process's memory), at most one queued or running."""

    def __init__(self) -> None:
        self.table: OrderedDict[str, SweepJob] = OrderedDict()

    def start(self, plan: SweepPlan, control: StepControl) -> SweepJob:
        running = next((j for j in self.table.values() if j.active), None)
        if running is not None:
            raise SweepJobRunning(f"Sweep {running.id} (feature {running.plan.feature} of {running.plan.sae}) is "
                                  f"{running.status}; one sweep runs at a time: retry once GET "
                                  f"/api/sweeps/{running.id} says it ended.", param="feature")
        job = SweepJob(plan, control=control)
        self.table[job.id] = job
        while len(self.table) > JOBS_KEPT:
            oldest = next(j for j in self.table.values() if not j.active)
            del self.table[oldest.id]
        return job

    def get(self, job_id: str) -> SweepJob:
        job = self.table.get(job_id)
        if job is None:
            raise SweepNotFound(f"No sweep has id '{job_id}' (the newest {JOBS_KEPT} are kept); see GET "
                                "/api/sweeps.", param="id")
        return job

    def cancel(self, job: SweepJob) -> None:
        """Stop ``job``: its slice running ends at its next decode step, and its record reads ``cancelled``; a
        sweep that ended is a 409."""
        if job.status == "cancelled":
            return
        if not job.active or job.control is None:
            raise SweepFinished(f"Sweep {job.id} has {job.status}; only a queued or running sweep can be "
                                "cancelled.", param="id")
        reason = SweepCancelled(f"Sweep {job.id} was cancelled by DELETE /api/sweeps/{job.id}.")
        job.control.stop(reason)
        job.end("cancelled", "cancelled", reason)


def sweep_jobs() -> SweepJobs:
    """The current app's sweep table."""
    extensions = current_app.extensions
    if EXTENSION not in extensions:
        extensions[EXTENSION] = SweepJobs()
    table: SweepJobs = extensions[EXTENSION]
    return table


def _concepts(value: Any, label: str, feature: int) -> tuple[str, ...]:
    """The words that count as mentioning the concept: ``concepts`` given, else the label's words; none is a 400."""
    if value is not None:
        if len(value) > MAX_CONCEPTS or any(len(w) > MAX_CONCEPT_CHARS for w in value):
            raise InvalidParameter(f"'concepts' takes at most {MAX_CONCEPTS} words of at most {MAX_CONCEPT_CHARS} "
                                   "characters.", param="concepts")
        words = tuple(dict.fromkeys(w.strip().lower() for w in value if w.strip()))
    else:
        words = label_words(label)
    if not words:
        raise InvalidParameter(f"Feature {feature} has no label words to look for; name them with 'concepts'.",
                               param="concepts")
    return words


def plan_of(data: dict[str, Any]) -> tuple[SweepPlan, Engine]:
    """The body (its types held to its schema already) checked whole against the loaded model and the attached
    SAEs, and the engine it runs on: every refusal comes before any model work."""
    svc = services()
    svc.manager.check_not_busy()
    engine = svc.manager.engine
    if engine is None:
        raise ModelNotLoaded("No model is loaded; load a transformers model to sweep a feature.")
    check_engine(engine)
    strengths = check_strengths([float(v) for v in data.get("strengths", STRENGTHS)], "'strengths'")
    prompts = check_int("prompts", data.get("prompts", PROMPTS), low=1, high=len(NEUTRAL_PROMPTS))
    held_out = check_int("held_out", data.get("held_out", len(HELD_OUT_PROMPTS)), low=1, high=len(HELD_OUT_PROMPTS))
    tokens = check_int("tokens", data.get("tokens", MAX_NEW_TOKENS), low=1, high=MAX_TOKENS)
    seed = check_int("seed", data.get("seed", SEED), low=0, high=SEED_MAX)
    scope = parse_scope(data.get("scope"), "scope") or ALL
    sae = data["sae"]
    record = svc.steering.sae(sae)  # 404 when no SAE or vector set has that id
    feature = check_index(data["feature"], int(record["d_sae"]), sae)
    target = engine.steering_target()
    attached = target.steering.attachments.get(sae) if target is not None else None
    if attached is None:
        raise InvalidParameter(f"'{sae}' is not attached to the loaded model; attach it first (POST "
                               f"/api/saes/{sae}/attach): a sweep measures it where it steers requests.",
                               param="sae")
    label = svc.steering.label_index(sae).labels.get(feature, "")
    words = _concepts(data.get("concepts"), label, feature)
    return SweepPlan(sae, attached.layer, feature, label, words, tuple(strengths), prompts, held_out, tokens, seed,
                     scope), engine


class SlicedEngine:
    """``engine`` as the measure sees it: each of its engine calls (prepare, tokenize, decode a set of answers,
    score) run as one slice on the engine thread, the decoding under the job's ``control``; every answer decoded
    is kept in ``answers`` by the strength its plan steered ``feature`` of ``sae`` with (the plans of one decode
    are ``per`` answers a strength, one for each of the measure's prompts)."""

    def __init__(self, engine: Engine, slices: Slices, plan: SweepPlan, per: int, answers: dict[float, list[str]],
                 progress: Callable[[str], None]) -> None:
        self.engine, self.slices, self.plan, self.per = engine, slices, plan, per
        self.answers, self.progress = answers, progress

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def prepare(self, request: GenerationRequest) -> Plan:
        return self.slices(lambda: self.engine.prepare(request))

    def tokenize(self, prompt: Prompt) -> list[int]:
        return self.slices(lambda: self.engine.tokenize(prompt))

    def score(self, request: ScoreRequest) -> list[ScoreResult]:
        self.progress(f"scoring {len(request.rows)} answers")
        return self.slices(lambda: self.engine.score(request))

    def run_all(self, plans: list[Plan], control: StepControl | None = None) -> Iterator[Event]:
        self.progress(f"sampling {len(plans)} answers")
        events = self.slices(lambda: list(self.engine.run_all(plans, self.slices.control)))
        texts = [""] * len(plans)
        for event in events:
            if isinstance(event, Delta):
                texts[event.index] += event.text
        per = self.per
        for k in range(0, len(plans), per):
            steering = plans[k].steering
            values = steering.values if steering is not None and steering.values is not None else {}
            self.answers[float(values.get(self.plan.sae, {}).get(self.plan.feature, 0.0))] = texts[k:k + per]
        yield from events


async def start(plan: SweepPlan, engine: Engine) -> SweepJob:
    """Start ``plan`` on ``engine`` in the background, holding a lease on the engine (an unload waits for it up
    to its graceful timeout, as for a request)."""
    svc = services()
    job = sweep_jobs().start(plan, StepControl(run_commands=svc.worker.run_commands))
    current_app.add_background_task(run_job, job, engine, svc.worker.lease())
    return job


async def run_job(job: SweepJob, engine: Engine, release: Callable[[], None]) -> None:
    """The sweep, from a thread of its own whose engine calls are slices on the engine thread."""
    svc, plan, loop, control = services(), job.plan, asyncio.get_running_loop(), job.control
    assert control is not None

    def progress(what: str) -> None:
        if job.active:
            job.progress = what

    def on_engine(work: Callable[[], Any]) -> Callable[[], Any]:
        def step() -> Any:
            stopped(control)
            if svc.manager.engine is not engine:
                raise ModelNotLoaded(f"'{engine.model_id}' was unloaded before sweep {job.id} ended; sweep again.")
            if job.status == "queued":
                job.status = "running"
            return work()
        return step

    slices = Slices(svc.worker, loop, control, on_engine)
    calibration = SlicedEngine(engine, slices, plan, plan.prompts, job.answers, progress)
    held_out = SlicedEngine(engine, slices, plan, plan.held_out, job.held_answers, progress)

    def program() -> dict[str, Any]:
        measure = Measure(cast(Engine, calibration), NEUTRAL_PROMPTS[:plan.prompts], plan.seed, plan.tokens,
                          scope=plan.scope)
        held = Measure(cast(Engine, held_out), HELD_OUT_PROMPTS[:plan.held_out], plan.seed, plan.tokens,
                       scope=plan.scope)
        return run_sweep(measure, held, plan.sae, plan.layer, plan.feature, plan.label, plan.words,
                         plan.strengths).to_json()

    try:
        with svc.worker.stoppable(control):
            job.result = await asyncio.to_thread(program)
        job.end("succeeded", f"measured {len(job.result['points'])} strengths")
    except MillmError as exc:
        job.end("cancelled" if control.cancel.is_set() else "failed", f"failed: {exc.message}", exc)
    except asyncio.CancelledError:  # the server is stopping: the slice running ends at its next step
        control.stop(MillmError("The server stopped before the sweep ended."))
        job.end("failed", "failed: the server stopped before the sweep ended")
        raise
    except Exception as exc:
        log.exception("sweep %s failed", job.id)
        job.end("failed", "failed", MillmError(f"Internal error: {exc}"))
    finally:
        job.control = None
        with contextlib.suppress(Exception):
            release()
