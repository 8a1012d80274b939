"""Generation for many requests at once: the one place ``millm batch`` decides how rows share the engine.

Where the engine has a scheduler (transformers), every request joins it: rows with different sampling
parameters, budgets and steering decode together in its batch, each as it would alone
(``millm.engine.decode.scheduler``). This process steps it through the decode loop's driver
(``millm.engine.decode.driver.run_together``), which maps its failures to the contract's errors as it does for
every front end; no server worker is involved. What the batch does not take (its fallbacks: n > 1, a seed,
extra_messages, return_sae_activations, response_format, a row longer than a KV slot) is served alone by the same
scheduler, exactly as the default (serial) server serves it: ``millm batch`` answers constrained rows
rather than refusing them.

Where there is no scheduler (llama.cpp), rows whose plans agree on everything but their prompts
(sampling parameters, token budget, the request's own steering values; no seed, schema or read-out) run as one
left-padded plan, and their events are split back per row.

Either way a row whose shared run fails is run again on its own, so one bad row cannot take its
neighbours' answers with it, and its answer is the serial server's.
"""

from __future__ import annotations

from dataclasses import dataclass

from millm.engine.base import Engine
from millm.engine.decode.driver import BatchSettings, Request, run_together
from millm.engine.events import Delta, Event, Finish, Steered, Usage
from millm.engine.plan import Plan


@dataclass(eq=False)
class Job(Request):
    """One request's plans, and what running them gave: its events, or the error that ended it."""

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
    return (a.params == b.params and a.max_tokens == b.max_tokens and _rows(a) == _rows(b) and a.scope == b.scope)


def _rows(plan: Plan) -> tuple[str, dict[str, dict[int, float]]] | None:
    """What a plan's rows steer with: its steering's name and own values; None: the live values."""
    steering = plan.steering
    return None if steering is None or steering.values is None else (steering.name, steering.values)


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


def _run_shared(engine: Engine, group: list[Job]) -> None:
    """One padded plan for the group; each choice's events go back to its job, with its own Usage."""
    first = group[0].plans[0]
    merged = Plan([ids for job in group for ids in job.plans[0].prompt_ids], first.params, first.max_tokens,
                  first.steering, scope=first.scope)
    owner: list[tuple[Job, int]] = []
    for job in group:
        owner += [(job, k) for k in range(job.choices)]
    done: dict[int, int] = {id(job): 0 for job in group}
    for event in engine.run(merged):
        _give_back(event, group, owner, done)
    for job in group:
        prompt_tokens = sum(len(ids) for ids in job.plans[0].prompt_ids)
        job.events.append(Usage(prompt_tokens, done[id(job)]))


def _give_back(event: Event, group: list[Job], owner: list[tuple[Job, int]], done: dict[int, int]) -> None:
    """One event of a group's padded plan, given to the job whose choice it is, renumbered as that job's;
    ``done`` counts each job's completion tokens."""
    if isinstance(event, Steered):  # one steering for the group: what steered it steered each job
        for job in group:
            job.events.append(event)
    elif isinstance(event, Delta):
        job, k = owner[event.index]
        job.events.append(Delta(k, event.text))
    elif isinstance(event, Finish):
        job, k = owner[event.index]
        job.events.append(Finish(k, event.reason, event.completion_tokens))
        done[id(job)] += event.completion_tokens


def run_padded(engine: Engine, jobs: list[Job], pads: bool = True) -> None:
    """Every job through ``Engine.run``: equal-parameter rows share one padded plan (with ``pads``)."""
    for group in groups(jobs, pads and engine.capabilities.multiple_choices):
        if len(group) == 1:
            group[0].run_alone(engine)
            continue
        try:
            _run_shared(engine, group)
        except Exception:
            for job in group:
                job.run_alone(engine)


def run_generations(engine: Engine, jobs: list[Job], batch: BatchSettings | None = None,
                    shares: bool = True) -> None:
    """Run every job, filling in its events or its error. Through the engine's decode loop where it has one
    (``millm.engine.decode.driver.run_together``): batched (sized by ``batch``) unless ``shares`` is false or the
    request is a batch fallback, else served alone. Elsewhere in padded groups (with ``shares``) or one by one."""
    if not run_together(engine, jobs, batch if shares else None):
        run_padded(engine, jobs, shares)
