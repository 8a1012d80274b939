"""Strength sweeps as background jobs of the management API (``POST /api/sweeps``): the body checked whole before
any model work (:func:`plan_of`), the job table (:func:`sweep_jobs`: a ``millm.server.jobs`` table kept in the
SQLite store, so a restart lists the sweeps and their results; one runs at a time), and the job itself
(:func:`start`).

A job runs ``millm steer sweep``'s measure (``millm.research.sweep.run_sweep`` on a ``Measure``) against a feature
of an SAE or vector set attached on the server, so its answers are the ones ``/v1/chat/completions`` gives for the
same message, seed and steering, and its numbers are the CLI's for the same seed. Its model work runs in slices
(``millm.server.slices``): every engine call the measure makes (preparing, decoding a set of answers, scoring) is
one engine job, with requests served between two. The answers decoded are kept beside the sweep's points, so a
page can show each point's answers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

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
from millm.server import jobs as job_tables
from millm.server.jobs import Job, Kind, Table
from millm.server.slices import Slices, start_on_engine, store
from millm.server.state import services
from millm.steering.scope import ALL, Scope, parse_scope

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


def view(job: Job) -> dict[str, Any]:
    """A sweep as the API shows it: its request and prompts, and once it succeeded its result, figure and
    answers."""
    f, done = job.fields, job.status == "succeeded"
    request, result = f["request"], f.get("result")
    return {"id": job.id, "object": "research.sweep_job", "status": job.status, "progress": job.progress,
            "created": int(job.created), "finished": int(job.finished) if job.finished else None,
            "request": request, "prompts": list(NEUTRAL_PROMPTS[:request["prompts"]]),
            "held_out_prompts": list(HELD_OUT_PROMPTS[:request["held_out"]]),
            "result": result if done else None,
            "figure": sweep_figure(result) if done and result is not None else None,
            "answers": f.get("answers") if done else None,
            "held_out_answers": f.get("held_out_answers") if done else None, "error": job.error}


def _by_strength(answers: dict[float, list[str]]) -> list[dict[str, Any]]:
    return [{"strength": s, "answers": a} for s, a in sorted(answers.items())]


KIND = Kind("research.sweep", "sweep", "/api/sweeps", "sweep_", SweepJobRunning, param="feature",
            not_found=SweepNotFound, finished=SweepFinished, cancelled=SweepCancelled, again="Sweep again.",
            about=lambda job: f" (feature {job.fields['request']['feature']} of {job.fields['request']['sae']})")


def sweep_jobs() -> Table:
    """The current app's sweeps (read from the store the first time it is asked for)."""
    return job_tables.table(KIND, store)


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


async def start(plan: SweepPlan, engine: Engine) -> Job:
    """Start ``plan`` on ``engine`` in the background (``start_on_engine``), its answers kept beside its result."""

    def program(job: Job, slices: Slices) -> tuple[dict[str, Any], dict[float, list[str]], dict[float, list[str]]]:
        answers: dict[float, list[str]] = {}
        held_answers: dict[float, list[str]] = {}
        calibration = SlicedEngine(engine, slices, plan, plan.prompts, answers, job.say)
        held_out = SlicedEngine(engine, slices, plan, plan.held_out, held_answers, job.say)
        measure = Measure(cast(Engine, calibration), NEUTRAL_PROMPTS[:plan.prompts], plan.seed, plan.tokens,
                          scope=plan.scope)
        held = Measure(cast(Engine, held_out), HELD_OUT_PROMPTS[:plan.held_out], plan.seed, plan.tokens,
                       scope=plan.scope)
        result = run_sweep(measure, held, plan.sae, plan.layer, plan.feature, plan.label, plan.words,
                           plan.strengths).to_json()
        return result, answers, held_answers

    def keep(job: Job, made: tuple[dict[str, Any], dict[float, list[str]], dict[float, list[str]]]) -> str:
        result, answers, held_answers = made
        job.fields.update(result=result, answers=_by_strength(answers), held_out_answers=_by_strength(held_answers))
        return f"measured {len(result['points'])} strengths"

    fields = {"request": plan.view(), "result": None, "answers": None, "held_out_answers": None}
    return await start_on_engine(sweep_jobs(), fields, engine, program, keep)
