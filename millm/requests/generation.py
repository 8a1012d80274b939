"""Preparing a built generation request: its steering, its plans, its limits and what its headers say.

One sequence for every front end (the server, ``millm chat``, the TUI, ``millm batch``), run on the
engine thread (it resolves steering against the attached SAEs and tokenises with the engine's
tokenizer), so every front end applies the same limits and nothing heavy runs on an event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from millm.errors import FieldNotHonoured
from millm.requests.limits import Limits, check_prompt_tokens, prompt_tokens
from millm.steering.core import RequestSteering
from millm.steering.scope import ALL, Scope

if TYPE_CHECKING:
    from millm.engine.base import Engine
    from millm.engine.plan import Plan
    from millm.requests.builder import Built
    from millm.steering.service import SteeringService
    from millm.steering.target import SteeringTarget


@dataclass(frozen=True)
class Prepared:
    """A generation ready to run: its plans, its steering, the X-miLLM-Steering label, and the check to
    run between decode steps (None: nothing an operator does can invalidate it). Its response headers are
    ``millm.render.headers.prepared_headers``."""

    plans: list[Plan]
    steering: RequestSteering
    label: str
    check: Callable[[], None] | None
    scope: Scope = ALL  # where its steering applies (the request's steering_scope, else its profile's)


def refuse_unsteerable(engine: Engine, built: Built) -> None:
    """``profile``, ``steering_intensity`` or ``steering_scope`` on an engine that cannot steer: refused, naming
    the field."""
    for name, value in (("profile", built.profile), ("steering_intensity", built.intensity),
                        ("steering_scope", built.scope)):
        if value is not None:
            raise FieldNotHonoured(f"'{name}' cannot be honoured by the {engine.engine_name} engine.", param=name)


def resolve_steering(engine: Engine, target: SteeringTarget | None, built: Built, service: SteeringService | None,
                     steering: RequestSteering | None) -> RequestSteering:
    """The request's steering on ``engine`` (whose steering target is ``target``): ``steering`` when already
    decided, else resolved through ``service`` (``profile`` and ``steering_intensity``); on an engine that cannot
    steer, those fields are refused."""
    if target is None:
        refuse_unsteerable(engine, built)
        return steering or RequestSteering()
    if steering is None:
        assert service is not None, "steering is resolved through the steering service"
        steering = service.for_request(target, built.profile, built.intensity)
    return steering


def prepare(engine: Engine, built: Built, limits: Limits, service: SteeringService | None = None,
            steering: RequestSteering | None = None) -> Prepared:
    """Resolve the request's steering (``profile`` and ``steering_intensity`` through ``service``, unless
    ``steering`` is already decided), tokenise and check every plan, and check the prompt tokens against
    ``limits``. Runs on the engine thread; raises before any forward pass."""
    target = engine.steering_target()
    decided = resolve_steering(engine, target, built, service, steering)
    scope = built.scope or decided.scope or ALL
    rows = decided if decided.values is not None else None  # the plans carry values of its own, else the live ones
    plans = [engine.prepare(replace(g, steering=rows, scope=scope)) for g in built.generations]
    check_prompt_tokens("messages" if built.route == "chat" else "prompt", prompt_tokens(plans), limits)
    if target is None:
        return Prepared(plans, decided, "none", None)
    core = target.steering
    check = (lambda: decided.check(core)) if decided.pinned else None
    return Prepared(plans, decided, core.label(decided), check, scope)
