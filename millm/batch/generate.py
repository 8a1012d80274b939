"""Generation for many requests at once: the one place ``millm batch`` decides how rows share the engine.

Today rows are shared through what ``Engine.run`` offers: a plan holds several prompts, left-padded into
one decode loop. Rows whose plans agree on everything but their prompts (sampling parameters, token
budget, steering override; no seed, schema or read-out, which are per request) run as one padded plan,
and their events are split back per row. Everything else runs on its own, exactly as the server runs it.
A continuous-batching scheduler can replace ``run_generations`` without touching its callers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from millm.engine.base import Engine
from millm.engine.events import Delta, Event, Finish, Usage
from millm.engine.plan import Plan, run_each


@dataclass
class Job:
    """One request's plans, and what running them gave: its events, or the error that ended it."""

    plans: list[Plan]
    events: list[Event] = field(default_factory=list)
    error: Exception | None = None

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
    return a.params == b.params and a.max_tokens == b.max_tokens and a.override == b.override


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
    try:
        job.events = list(run_each(engine.run, job.plans))
    except Exception as exc:  # answered as the server's error handlers answer it, never a crash
        job.error = exc


def _run_shared(engine: Engine, group: list[Job]) -> None:
    """One padded plan for the group; each choice's events go back to its job, with its own Usage."""
    first = group[0].plans[0]
    merged = Plan([ids for job in group for ids in job.plans[0].prompt_ids], first.params, first.max_tokens,
                  first.override)
    owner: list[tuple[Job, int]] = []
    for job in group:
        owner += [(job, k) for k in range(job.choices)]
    done: dict[int, int] = {id(job): 0 for job in group}
    for event in engine.run(merged):
        if isinstance(event, Delta):
            job, k = owner[event.index]
            job.events.append(Delta(k, event.text))
        elif isinstance(event, Finish):
            job, k = owner[event.index]
            job.events.append(Finish(k, event.reason, event.completion_tokens))
            done[id(job)] += event.completion_tokens
    for job in group:
        prompt_tokens = sum(len(ids) for ids in job.plans[0].prompt_ids)
        job.events.append(Usage(prompt_tokens, done[id(job)]))


def run_generations(engine: Engine, jobs: list[Job], pads: bool = True) -> None:
    """Run every job, filling in its events or its error. A shared run that fails is run again job by
    job, so one bad row cannot take its neighbours' answers with it."""
    for group in groups(jobs, pads and engine.capabilities.multiple_choices):
        if len(group) == 1:
            _run_alone(engine, group[0])
            continue
        try:
            _run_shared(engine, group)
        except Exception:
            for job in group:
                job.events = []
                _run_alone(engine, job)
