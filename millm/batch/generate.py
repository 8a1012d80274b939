"""Generation for many requests at once: the one place ``millm batch`` decides how rows share the engine.

Where the engine has a scheduler (transformers), every request joins it: rows with different sampling
parameters, budgets and steering decode together in its batch, each as it would alone
(``millm.engine.decode.scheduler``). This process drives the scheduler's steps itself; no server worker is
involved. What the batch does not take (its fallbacks: n > 1, a seed, extra_messages,
return_sae_activations, response_format, a row longer than a KV slot) is served alone by the same
scheduler, exactly as the default (serial) server serves it: ``millm batch`` answers constrained rows
rather than refusing them.

Where there is no scheduler (llama.cpp), rows whose plans agree on everything but their prompts
(sampling parameters, token budget, steering override; no seed, schema or read-out) run as one
left-padded plan, and their events are split back per row.

Either way a row whose shared run fails is run again on its own, so one bad row cannot take its
neighbours' answers with it, and its answer is the serial server's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from millm.engine.base import Engine, StepControl
from millm.engine.decode.admission import BatchSettings, fallback_reason
from millm.engine.decode.scheduler import Job as Scheduled
from millm.engine.decode.scheduler import Scheduler
from millm.engine.events import Delta, Event, Finish, Steered, Usage
from millm.engine.plan import Plan


@dataclass
class Job:
    """One request's plans, and what running them gave: its events, or the error that ended it."""

    plans: list[Plan]
    events: list[Event] = field(default_factory=list)
    error: Exception | None = None
    check: Callable[[], None] | None = None  # between steps: raises when its steering no longer applies

    @property
    def shareable(self) -> bool:
        """One plan, with nothing a padded neighbour could change: no seed, schema or read-out."""
        if len(self.plans) != 1:
            return False
        plan = self.plans[0]
        return plan.params.seed is None and plan.constraint is None and plan.readout is None

    @property
    def choices(self) -> int:
        return sum(len(p.prompt_ids) * p.params.n for p in self.plans)


def _same_run(a: Plan, b: Plan) -> bool:
    return (a.params == b.params and a.max_tokens == b.max_tokens and a.override == b.override
            and a.scope == b.scope)


def groups(jobs: list[Job], pads: bool) -> list[list[Job]]:
    """Jobs that can share one padded plan, in first-seen order; with ``pads`` false, each on its own."""
    out: list[list[Job]] = []
    for job in jobs:
        home = next((g for g in out if pads and job.shareable and g[0].shareable
                     and _same_run(g[0].plans[0], job.plans[0])), None)
        if home is None:
            out.append([job])
        else:
            home.append(job)
    return out


def _run_alone(engine: Engine, job: Job) -> None:
    job.events = []
    job.error = None
    control = StepControl() if job.check is None else StepControl().checking(job.check)
    try:
        job.events = list(engine.run_all(job.plans, control))
    except Exception as exc:  # answered as the server's error handlers answer it, never a crash
        job.error = exc


def _run_shared(engine: Engine, group: list[Job]) -> None:
    """One padded plan for the group; each choice's events go back to its job, with its own Usage."""
    first = group[0].plans[0]
    merged = Plan([ids for job in group for ids in job.plans[0].prompt_ids], first.params, first.max_tokens,
                  first.override, scope=first.scope)
    owner: list[tuple[Job, int]] = []
    for job in group:
        owner += [(job, k) for k in range(job.choices)]
    done: dict[int, int] = {id(job): 0 for job in group}
    for event in engine.run(merged):
        if isinstance(event, Steered):  # one override for the group: what steered it steered each job
            for job in group:
                job.events.append(event)
        elif isinstance(event, Delta):
            job, k = owner[event.index]
            job.events.append(Delta(k, event.text))
        elif isinstance(event, Finish):
            job, k = owner[event.index]
            job.events.append(Finish(k, event.reason, event.completion_tokens))
            done[id(job)] += event.completion_tokens
    for job in group:
        prompt_tokens = sum(len(ids) for ids in job.plans[0].prompt_ids)
        job.events.append(Usage(prompt_tokens, done[id(job)]))


def run_padded(engine: Engine, jobs: list[Job], pads: bool = True) -> None:
    """Every job through ``Engine.run``: equal-parameter rows share one padded plan (with ``pads``)."""
    for group in groups(jobs, pads and engine.capabilities.multiple_choices):
        if len(group) == 1:
            _run_alone(engine, group[0])
            continue
        try:
            _run_shared(engine, group)
        except Exception:
            for job in group:
                _run_alone(engine, job)


def run_scheduled(scheduler: Scheduler, jobs: list[Job], alone: list[bool]) -> list[Job]:
    """Submit every job to ``scheduler`` (served alone where ``alone`` says so) and step it until each has
    ended; the batched jobs that ended with an error (their events are partial) are returned, to be run
    again on their own."""
    ended: dict[int, BaseException | None] = {}

    def ender(job: Job) -> Callable[[BaseException | None], None]:
        def end(error: BaseException | None) -> None:
            ended[id(job)] = error
        return end

    for job, own in zip(jobs, alone):
        scheduler.submit(Scheduled(job.plans, StepControl(), job.events.append, ender(job), job.check, alone=own))
    try:
        while len(ended) < len(jobs) and scheduler.busy:
            try:
                scheduler.step()
            except Exception as exc:  # outside any one row: every request in the batch ends with it
                scheduler.fail_all(exc)
    except BaseException as exc:  # interrupted: free every slot before the interruption goes on
        scheduler.fail_all(exc)
        raise
    for job, own in zip(jobs, alone):
        if own and id(job) in ended and ended[id(job)] is not None:
            error = ended[id(job)]
            job.error = error if isinstance(error, Exception) else Exception(str(error))
    return [job for job, own in zip(jobs, alone) if not own and (id(job) not in ended or ended[id(job)] is not None)]


def scheduler_of(engine: Engine, batch: BatchSettings | None) -> Scheduler | None:
    """The engine's scheduler (batching with ``batch``; None: serving each alone), or None where the engine
    has none (llama.cpp)."""
    make = getattr(engine, "batch_scheduler", None)
    if make is None or not engine.capabilities.batchable:
        return None
    scheduler: Scheduler = make(batch)
    return scheduler


def run_generations(engine: Engine, jobs: list[Job], batch: BatchSettings | None = None,
                    shares: bool = True) -> None:
    """Run every job, filling in its events or its error. Through the engine's scheduler where it has one:
    batched (sized by ``batch``) unless ``shares`` is false or the request is a batch fallback, else served
    alone. Elsewhere in padded groups (with ``shares``) or one by one."""
    scheduler = scheduler_of(engine, batch if shares else None)
    if scheduler is None:
        run_padded(engine, jobs, shares)
        return
    target = engine.steering_target()
    monitoring = target is not None and target.monitor.config.enabled
    settings = scheduler.settings
    alone = [settings is None or fallback_reason(job.plans, settings, monitoring) is not None for job in jobs]
    for job in run_scheduled(scheduler, jobs, alone):
        _run_alone(engine, job)
