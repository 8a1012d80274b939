"""One chat's own steering (``millm chat --sae/--layer/--steer/--profile/--intensity``, a sweep's SAE): an SAE
attached for the session only and the request steering it asks for, undone afterwards, never persisted.

The CLI, the TUI and the research code share it; it changes hooks, so it runs where the engine's work runs
(the CLI's one thread, or the engine thread).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from millm.sae.model import SAE
    from millm.steering.core import RequestSteering, SteeringCore
    from millm.steering.intensity import Dial
    from millm.steering.service import SteeringService
    from millm.steering.target import SteeringTarget


def _request_steering() -> RequestSteering:
    from millm.steering.core import RequestSteering  # torch: imported when a chat is steered, not by `millm --help`

    return RequestSteering()


@dataclass(frozen=True)
class SteeredChat:
    """One chat, steered for its duration: the ``steering`` each of its answers is prepared with (its values None:
    the live values as they are), whether those are the chat's own ``--steer`` values, why a profile steers nothing
    (``unfit``), and the SAEs ``--sae`` set aside for the chat."""

    steering: RequestSteering = field(default_factory=_request_steering)
    own: bool = False
    unfit: str | None = None
    set_aside: tuple[str, ...] = ()


def profile_unfit(service: SteeringService, steering: SteeringCore, name: str) -> str | None:
    """Why profile ``name`` cannot steer through the SAEs attached now (None: every entry fits). A circuit
    serves through whatever is attached (natively, its fallback cluster, or not at all), so it always fits."""
    from millm.errors import SAENotAttached

    if service.store.backing(name) == "circuit":
        return None
    for entry in service.profile_doc(name).entries:
        try:
            att = steering.resolve_sae(entry.sae)
        except SAENotAttached:
            where = (f"layer {entry.sae}, where no SAE is attached" if isinstance(entry.sae, int)
                     else f"SAE {entry.sae}, which is not attached")
            return f'profile "{name}" names {where}'
        if entry.feature >= att.sae.d_sae:
            return f'profile "{name}" has feature {entry.feature}, past the {att.sae.d_sae} of SAE {att.sae_id}'
    return None


@contextmanager
def _on_layer(steering: SteeringCore, sae_id: str, load: Callable[[], SAE], layer: int) -> Iterator[tuple[str, ...]]:
    """``sae_id`` attached at ``layer`` for the duration, whatever was attached or active; yields the SAEs set
    aside (the one on that layer). Afterwards the attachments, their values and the active profile are what
    they were, and nothing was persisted."""
    before = [(a.sae_id, a.sae, a.layer) for a in steering.attachments.values()]
    values = {a.sae_id: dict(a.values) for a in steering.attachments.values()}
    active = steering.active_profile
    current = steering.attachments.get(sae_id)
    if current is not None and current.layer == layer:
        yield ()
        return
    aside = tuple(a.sae_id for a in steering.attachments.values() if a.layer == layer and a.sae_id != sae_id)
    try:
        for other in aside:
            steering.detach(other)
        steering.attach(sae_id, current.sae if current is not None else load(), layer)
        yield aside
    finally:
        if current is None:
            if sae_id in steering.attachments:
                steering.detach(sae_id)
        elif steering.attachments.get(sae_id) is not None:
            steering.attach(sae_id, current.sae, current.layer)  # back where it was (keeps its values)
        for sid, sae, at in before:
            if sid not in steering.attachments:
                steering.attach(sid, sae, at)
        put_back(steering, active, values)


def put_back(steering: SteeringCore, active: str | None, values: dict[str, dict[int, float]]) -> None:
    """The active profile and the live values as they were before a block that changed them (on the
    controller only: nothing is persisted); values of SAEs no longer attached are dropped."""
    values = {sid: vals for sid, vals in values.items() if sid in steering.attachments}
    if active is not None:
        steering.activate(active, values)
        return
    for sid, vals in values.items():
        if steering.attachments[sid].values != vals:
            steering.set_values(sid, vals, merge=False)


def _placed(service: SteeringService, steering: SteeringCore, sae: str | None,
            layer: int | None) -> AbstractContextManager[tuple[str, ...]]:
    """``sae`` on its chat's layer for the duration (:func:`_on_layer`), or nothing without ``sae``."""
    from millm.errors import InvalidParameter
    from millm.sae.formats import load_sae

    if sae is None:
        if layer is not None:
            raise InvalidParameter("--layer goes with --sae.", param="layer")
        return nullcontext(())
    record = service.sae(sae)
    current = steering.attachments.get(sae)
    at = layer if layer is not None else current.layer if current is not None else record["layer_hint"]
    if at is None:
        raise InvalidParameter(f"SAE {sae} has no layer hint; give --layer.", param="layer")
    return _on_layer(steering, sae, lambda: load_sae(record["path"]).sae, at)


def _dialled(service: SteeringService, engine: SteeringTarget, sae: str | None, profile: str | None,
             dial: Dial, aside: tuple[str, ...]) -> SteeredChat:
    """A chat steered by ``profile`` (else the active profile) at ``dial``; with ``sae`` given, a profile that does
    not fit what is attached steers nothing, and a dial alone falls back to the live values."""
    from millm.steering.core import RequestSteering

    steering, bases = engine.steering, service.bases(engine)
    name = profile if profile is not None else bases.active()
    unfit = profile_unfit(service, steering, name) if sae is not None and name is not None else None
    if unfit is None:
        return SteeredChat(bases.request(profile, dial), set_aside=aside)
    if profile is not None:  # the named profile steers nothing in this chat
        return SteeredChat(RequestSteering(profile, {}), unfit=unfit, set_aside=aside)
    live = {a.sae_id: dict(a.values) for a in steering.attachments.values()} if steering.enabled else {}
    return SteeredChat(bases.request(None, dial, own=live), unfit=unfit, set_aside=aside)  # the live values


def _assigned(service: SteeringService, engine: SteeringTarget, sae: str | None, assignments: dict[int, float],
              dial: Dial, aside: tuple[str, ...]) -> SteeredChat:
    """A chat steered by the live values with ``assignments`` added on ``sae`` (or the one attached SAE)."""
    from millm.errors import InvalidParameter
    from millm.steering.values import check_values

    steering = engine.steering
    target = sae or (next(iter(steering.attachments)) if len(steering.attachments) == 1 else None)
    if target is None:
        raise InvalidParameter("--steer needs --sae when zero or several SAEs are attached.", param="steer")
    values = {a.sae_id: dict(a.values) for a in steering.attachments.values()}
    values[target] = {**values[target], **check_values(assignments, steering.attachments[target].sae.d_sae, "steer")}
    return SteeredChat(service.bases(engine).request(None, dial, own=values), own=True, set_aside=aside)


@contextmanager
def chat_steering(service: SteeringService, engine: SteeringTarget, sae: str | None, layer: int | None,
                  assignments: dict[int, float], profile: str | None, dial: Dial = None) -> Iterator[SteeredChat]:
    """Steering for one chat, undone afterwards, never persisted.

    ``sae`` is attached for the chat at ``layer`` (default: where it is attached, else its hint); it takes
    that layer over whatever is attached or active: an SAE already there is set aside, an ``sae`` attached
    elsewhere is moved, and both are put back after. ``assignments`` add values over the live ones on
    ``sae`` (or the one attached SAE); ``profile`` replaces the live values; ``dial`` scales whichever is
    the base (as ``steering_intensity`` does on a request). With ``sae`` given, a profile that does not fit
    the SAEs attached for the chat steers nothing (``unfit`` says why) instead of being refused.
    """
    with _placed(service, engine.steering, sae, layer) as aside:
        if profile is not None or (dial is not None and not assignments):
            yield _dialled(service, engine, sae, profile, dial, aside)
        elif assignments:
            yield _assigned(service, engine, sae, assignments, dial, aside)
        else:
            yield SteeredChat(set_aside=aside)
