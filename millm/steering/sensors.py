"""Cluster sensing: an imported cluster's member features read through its attached SAE while answers are
written, and an event where enough of them exceed their thresholds.

A cluster senses once it is switched on (``POST /api/clusters/{name}/sensing``): its ``ClusterSensor`` is held
by its SAE's attachment (``Attachment.sensors``), so detaching the SAE (or unloading the model) stops it with
nothing left reading. Each member's threshold is an activation of its feature: the document's ``threshold``,
else half the max activation its SAE's card records (``features.jsonl``); a member with neither cannot be
sensed, and switching the cluster on is refused naming it.

A generation request reads them while it decodes (``millm.steering.sensing``). A cluster fires once per answer,
at the first response position where at least ``min_members`` members exceed their thresholds; its score is how
many did there. Scoring and embeddings run with the hooks suppressed: never sensed. Imports no torch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from millm.errors import InvalidParameter

if TYPE_CHECKING:
    from millm.steering.documents import ClusterDoc

CARD_SHARE = 0.5  # a member's default threshold: this share of its feature's max activation on the SAE's card


@dataclass(frozen=True)
class ClusterSensor:
    """One sensing cluster on its SAE: its members' features and thresholds (``from_card``: derived from the
    SAE's card, not given), and how many must exceed theirs at one position for it to fire."""

    name: str
    sae_id: str
    features: tuple[int, ...]
    thresholds: tuple[float, ...]
    from_card: tuple[bool, ...]
    min_members: int

    def describe(self) -> dict[str, Any]:
        """What ``GET /api/clusters/{name}`` shows under ``sensing``."""
        return {"sae": self.sae_id, "min_members": self.min_members,
                "members": [{"feature": f, "threshold": t, "from_card": c}
                            for f, t, c in zip(self.features, self.thresholds, self.from_card)]}


def check_min_members(value: Any, members: int) -> int:
    """How many members must exceed their thresholds: an integer from 1 to the cluster's size, or a 400 naming
    ``min_members``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= members:
        raise InvalidParameter(f"'min_members' must be an integer from 1 to {members} (the cluster's members), got "
                               f"{value!r}.", param="min_members")
    return value


def sensor_for(cluster: ClusterDoc, sae_id: str, max_activations: Mapping[int, float],
               min_members: Any = 1) -> ClusterSensor:
    """The sensor of ``cluster`` on the attached SAE ``sae_id`` whose card records ``max_activations`` (feature
    -> its max activation): each member's threshold given or derived (``CARD_SHARE`` of it); a member with
    neither is a 400 naming ``/members/i/threshold``."""
    count = check_min_members(min_members, len(cluster.members))
    thresholds: list[float] = []
    derived: list[bool] = []
    for i, member in enumerate(cluster.members):
        if member.threshold is not None:
            thresholds.append(member.threshold)
            derived.append(False)
            continue
        top = max_activations.get(member.feature)
        if top is None or not top > 0:
            where = f"/members/{i}/threshold"
            raise InvalidParameter(f"Cluster '{cluster.name}' member {i} (feature {member.feature}) gives no threshold "
                                   f"and SAE {sae_id}'s card records no max activation for it to derive one from; "
                                   f"give {where} (an activation of that feature) in the document.", param=where)
        thresholds.append(round(CARD_SHARE * top, 6))
        derived.append(True)
    return ClusterSensor(cluster.name, sae_id, tuple(m.feature for m in cluster.members), tuple(thresholds),
                         tuple(derived), count)
