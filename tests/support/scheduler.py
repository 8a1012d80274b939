"""Driving the decode scheduler by hand: a plan, a plan run alone, a job submitted, the batch drained."""

from __future__ import annotations

from typing import TYPE_CHECKING

from millm.engine.base import StepControl
from millm.engine.events import Delta, Event, Finish
from millm.engine.params import ChatPrompt, GenerationRequest, SamplingParams, TextPrompt

if TYPE_CHECKING:
    from millm.engine.decode.scheduler import Scheduler
    from millm.engine.plan import Plan


class Consumer:
    """One request's view of the batch: its events, and how it ended."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.ended = False
        self.error: BaseException | None = None
        self.control = StepControl()

    def end(self, error: BaseException | None) -> None:
        self.ended, self.error = True, error

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, Delta))

    @property
    def finishes(self) -> list[str]:
        return [e.reason for e in self.events if isinstance(e, Finish)]


def plan(engine, prompt: str, steering=None, chat: bool = False, scope: str = "all", **params) -> Plan:
    params.setdefault("temperature", 0.0)
    params.setdefault("max_tokens", 8)
    p = ChatPrompt([{"role": "user", "content": prompt}]) if chat else TextPrompt(prompt)
    return engine.prepare(GenerationRequest([p], SamplingParams(**params), steering=steering, scope=scope))


def alone(engine, p: Plan) -> tuple[str, list[str]]:
    events = list(engine.run(p))
    return "".join(e.text for e in events if isinstance(e, Delta)), [e.reason for e in events if isinstance(e, Finish)]


def submit(scheduler: Scheduler, *plans: Plan, check=None) -> Consumer:
    from millm.engine.decode.scheduler import Job  # torch: imported when a test runs, never at collection

    consumer = Consumer()
    scheduler.submit(Job(list(plans), consumer.control, consumer.events.append, consumer.end, check))
    return consumer


def drain(scheduler: Scheduler, limit: int = 500) -> int:
    steps = 0
    while scheduler.busy:
        scheduler.step()
        steps += 1
        assert steps < limit
    return steps
