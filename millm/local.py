"""This process's loaded engines and its steering service: what the CLI and the TUI share in-process.

Heavy modules are imported inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from millm.config import get_settings

if TYPE_CHECKING:
    from millm.engine.base import Engine
    from millm.sae.model import SAE
    from millm.steering.bases import RequestSteering
    from millm.steering.controller import Steering
    from millm.steering.intensity import Dial
    from millm.steering.service import SteeringService
    from millm.steering.target import SteeringTarget

ENGINES: dict[str, Engine] = {}  # model id -> its engine, loaded once per process


def steering_service() -> SteeringService:
    """The SAE registry, profiles and persisted steering under MILLM_HOME."""
    from millm.steering.service import SteeringService
    from millm.store import Store

    return SteeringService(Store(get_settings().home / "millm.db"))


def engine_for(model: str | None,
               loading: Callable[[str], AbstractContextManager[object]] = lambda _: nullcontext()) -> Engine:
    """The engine for ``model`` (default: the configured default), loaded once per process (inside
    ``loading(model_id)``, a progress display), with the SAE attachments and steering values persisted for
    it re-applied."""
    from millm.engine import load_engine
    from millm.registry import resolve

    settings = get_settings()
    entry = resolve(model or settings.default_model, settings, paths=True)
    if entry.id not in ENGINES:
        with loading(entry.id):
            engine = load_engine(entry, settings)
            steering_service().restore(engine.steering_target())
            ENGINES[entry.id] = engine
    return ENGINES[entry.id]


# one chat's own steering (millm chat --sae/--layer/--steer/--profile/--intensity)
def _request_steering() -> RequestSteering:
    from millm.steering.bases import RequestSteering

    return RequestSteering()


@dataclass(frozen=True)
class ChatSteering:
    """What one chat's answers run with: ``steer`` (its override None: the live values as they are), whether it
    is the chat's own ``--steer`` values, why a profile steers nothing (``unfit``), and the SAEs ``--sae`` set
    aside for the chat."""

    steer: RequestSteering = field(default_factory=_request_steering)
    own: bool = False
    unfit: str | None = None
    set_aside: tuple[str, ...] = ()


def profile_unfit(service: SteeringService, steering: Steering, name: str) -> str | None:
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
def _on_layer(steering: Steering, sae_id: str, load: Callable[[], SAE], layer: int) -> Iterator[tuple[str, ...]]:
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


def put_back(steering: Steering, active: str | None, values: dict[str, dict[int, float]]) -> None:
    """The active profile and the live values as they were before a block that changed them (on the
    controller only: nothing is persisted); values of SAEs no longer attached are dropped."""
    values = {sid: vals for sid, vals in values.items() if sid in steering.attachments}
    if active is not None:
        steering.activate(active, values)
        return
    for sid, vals in values.items():
        if steering.attachments[sid].values != vals:
            steering.set_values(sid, vals, merge=False)


@contextmanager
def chat_steering(service: SteeringService, engine: SteeringTarget, sae: str | None, layer: int | None,
                  assignments: dict[int, float], profile: str | None, dial: Dial = None) -> Iterator[ChatSteering]:
    """Steering for one chat, undone afterwards, never persisted.

    ``sae`` is attached for the chat at ``layer`` (default: where it is attached, else its hint); it takes
    that layer over whatever is attached or active: an SAE already there is set aside, an ``sae`` attached
    elsewhere is moved, and both are put back after. ``assignments`` add values over the live ones on
    ``sae`` (or the one attached SAE); ``profile`` replaces the live values; ``dial`` scales whichever is
    the base (as ``steering_intensity`` does on a request). With ``sae`` given, a profile that does not fit
    the SAEs attached for the chat steers nothing (``unfit`` says why) instead of being refused.
    """
    from millm.errors import InvalidParameter
    from millm.sae.formats import load_sae
    from millm.steering.bases import RequestSteering
    from millm.steering.controller import Override
    from millm.steering.values import check_values

    if sae is None and layer is not None:
        raise InvalidParameter("--layer goes with --sae.", param="layer")
    steering = engine.steering
    placed: AbstractContextManager[tuple[str, ...]] = nullcontext(())
    if sae is not None:
        record = service.sae(sae)
        current = steering.attachments.get(sae)
        at = layer if layer is not None else current.layer if current is not None else record["layer_hint"]
        if at is None:
            raise InvalidParameter(f"SAE {sae} has no layer hint; give --layer.", param="layer")
        placed = _on_layer(steering, sae, lambda: load_sae(record["path"]).sae, at)
    with placed as aside:
        bases = service.bases(engine)
        live = {a.sae_id: dict(a.values) for a in steering.attachments.values()}
        if profile is not None or (dial is not None and not assignments):
            name = profile if profile is not None else bases.active()
            unfit = profile_unfit(service, steering, name) if sae is not None and name is not None else None
            if unfit is None:
                yield ChatSteering(bases.request(profile, dial), set_aside=aside)
            elif profile is not None:  # the named profile steers nothing in this chat
                yield ChatSteering(RequestSteering(Override(profile, {})), unfit=unfit, set_aside=aside)
            else:  # the dial scales the live values, not the active profile they no longer fit
                own = live if steering.enabled else {}
                yield ChatSteering(bases.request(None, dial, own=own), unfit=unfit, set_aside=aside)
        elif assignments:
            target = sae or (next(iter(steering.attachments)) if len(steering.attachments) == 1 else None)
            if target is None:
                raise InvalidParameter("--steer needs --sae when zero or several SAEs are attached.", param="steer")
            values = live
            width = steering.attachments[target].sae.d_sae
            values[target] = {**values[target], **check_values(assignments, width, "steer")}
            yield ChatSteering(bases.request(None, dial, own=values), own=True, set_aside=aside)
        else:
            yield ChatSteering(set_aside=aside)
