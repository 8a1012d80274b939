"""``millm batch --sae SAE --steer FEATURE[=S]``: values the whole job steers with, on top of the live values.

A batch line steers as the server would steer it (``profile``, ``steering_intensity``, else the live values
MILLM_HOME persists); ``--steer`` changes what those live values are for this job, as ``millm steer set``
would change them before it (merged in, a 0 removes a feature, the active profile no longer active), but on
the loaded engines only: nothing is persisted, and afterwards each engine's values are put back. Lines are
then answered exactly as the server answers them with those live values (``X-miLLM-Steering: live``).

The names were resolved by the caller through the one ``--steer`` rule (``LabelIndex.resolve_assignments``:
a feature alone takes its recommended strength), before any line is answered; this module checks where they
can apply and applies them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from millm.errors import InvalidParameter

if TYPE_CHECKING:
    from millm.engine.base import Engine
    from millm.registry import ModelEntry
    from millm.steering.service import SteeringService

Engines = Callable[["ModelEntry"], "Engine"]


@dataclass(frozen=True)
class JobSteering:
    """``{index: strength}`` on ``sae_id`` for every line of one job."""

    sae_id: str
    values: dict[int, float]

    def describe(self) -> str:
        """How the job's report names it: ``SAE 5=60, 9=-15``."""
        return f"{self.sae_id} " + ", ".join(f"{i}={s:g}" for i, s in self.values.items())


def steered_sae(service: SteeringService, sae_id: str | None, model_ids: list[str]) -> str:
    """The SAE ``--steer`` names features of: ``sae_id``, which must be attached (as MILLM_HOME persists it) to a
    model the job's lines name, or without it the one SAE attached to those models; refused naming ``sae``."""
    attached = {sid: model for model in model_ids for sid in service.attached_layers(model)}
    if sae_id is None:
        if len(attached) != 1:
            raise InvalidParameter(f"--steer needs --sae: {len(attached)} SAEs are attached to the models this batch "
                                   f"names ({', '.join(model_ids) or 'none'}).", param="sae")
        return next(iter(attached))
    service.sae(sae_id)
    if sae_id not in attached:
        raise InvalidParameter(f"SAE {sae_id} is not attached to a model this batch names "
                               f"({', '.join(model_ids) or 'none'}); its lines steer through the SAEs attached "
                               f"there: attach it first (millm sae attach {sae_id}).", param="sae")
    return sae_id


@dataclass
class SteeredEngines:
    """``load`` (an engine per model, its persisted steering restored) with ``steering``'s values merged into
    the live values of each engine ``steering``'s SAE is attached to, once per engine; :meth:`undo` puts each
    one's values and active profile back. Without ``steering``, ``load`` as it is."""

    load: Engines
    steering: JobSteering | None
    _before: dict[str, tuple[Engine, str | None, dict[str, dict[int, float]]]] = field(default_factory=dict)

    def __call__(self, entry: ModelEntry) -> Engine:
        engine = self.load(entry)
        target = engine.steering_target()
        job = self.steering
        if job is None or target is None or entry.id in self._before:
            return engine
        steering = target.steering
        if job.sae_id in steering.attachments:
            self._before[entry.id] = (engine, steering.active_profile,
                                      {a.sae_id: dict(a.values) for a in steering.attachments.values()})
            steering.set_values(job.sae_id, job.values, merge=True)
        return engine

    def undo(self) -> None:
        """Each steered engine's live values and active profile as they were before the job."""
        from millm.steering.session import put_back

        for engine, active, values in self._before.values():
            target = engine.steering_target()
            if target is not None:
                put_back(target.steering, active, values)
        self._before.clear()
