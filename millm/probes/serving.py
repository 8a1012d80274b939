"""Probes on generation requests: the attached probes and the asked ones, and the watches a request serves
(each probe checked against the loaded model, a ``steer`` action's profile resolved).

A request is watched by every attached probe learned on the loaded model (an attached probe for another model
watches that model's requests only) and by the probes its ``probes`` field names: a name, or ``{"name",
"action"?, "profile"?}``; a name both attached and asked for is served once, as the request asks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from millm.probes import catalog
from millm.probes.asks import Ask
from millm.probes.probe import Probe, identity
from millm.steering.probe import Watch

if TYPE_CHECKING:
    from millm.engine.base import Engine
    from millm.requests.builder import Built
    from millm.steering.service import SteeringService


def loaded(home: Path, asks: tuple[Ask, ...]) -> list[tuple[Probe, Ask, bool]]:
    """The attached probes and the asked ones, loaded (an asked one that does not exist: 404), each with its
    ask and whether the request asked for it (a blocking read: call it off the event loop)."""
    asked = {a.name: a for a in asks}
    out = [(catalog.load(home, a.name), a, True) for a in asks]
    for name, how in catalog.attached(home).items():
        if name not in asked and catalog.path_of(home, name).is_file():
            out.append((catalog.load(home, name), Ask(name, how.get("action", "flag"), how.get("profile")), False))
    return out


def watches(engine: Engine, service: SteeringService | None,
            probes: list[tuple[Probe, Ask, bool]]) -> tuple[Watch, ...]:
    """What the request serves on ``engine``: each asked probe checked against the loaded model (another model's
    is a 400 naming both), each attached one of this model; a ``steer`` action's profile resolved (404 unknown,
    400 when it does not fit what is attached). Runs on the engine thread."""
    if not probes:
        return ()
    target = engine.steering_target()
    if target is None or not engine.capabilities.reads:
        if any(asked for _, _, asked in probes):
            identity(engine)  # the refusal: probes need a transformers model
        return ()
    model = identity(engine)
    out: list[Watch] = []
    for probe, ask, asked in probes:
        if not asked and probe.model != model:
            continue
        probe.check_model(model)
        steering = None
        if ask.action == "steer":
            assert service is not None and ask.profile is not None
            probe.watch(ask.action, ask.profile, None, ask.param)  # the action's refusals before the profile's
            steering = service.for_request(target, ask.profile, None)
        out.append(probe.watch(ask.action, ask.profile, steering, ask.param))
    return tuple(out)


def with_probes(engine: Engine, built: Built, service: SteeringService | None,
                probes: list[tuple[Probe, Ask, bool]]) -> Built:
    """``built`` with its generations watched by ``probes`` (``watches``)."""
    found = watches(engine, service, probes)
    if not found:
        return built
    return replace(built, generations=[replace(g, probes=found) for g in built.generations])
