"""One request's sensing clusters while it decodes (``millm.steering.sensors`` says what a sensor is).

A generation request starts a ``ClusterSensing`` only while some attached SAE has a sensor (nothing is read
otherwise). Each decoding row's fed token is read at the SAE's layer before its steering delta, where monitoring
reads, through the SAE's own encoder (``SAE.encode`` of the members' features alone): one encode per row, SAE
and step, and one matrix product counting each cluster's members over their thresholds, written into a buffer
allocated when the request starts. The firings (each cluster's first response position with at least
``min_members`` members over, per row) are computed once, when the request ends."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from millm.sae.model import SAE
    from millm.steering.sensors import ClusterSensor


@dataclass
class _OnSAE:
    """The sensors of one SAE a request reads: the members' features (each sensor's in turn), their thresholds,
    which sensor each member counts for, and each sensor's firing count; ``first`` is the sensors' first column
    in the request's buffer."""

    sae: SAE
    sensors: list[ClusterSensor]
    first: int
    features: torch.Tensor = field(init=False)
    thresholds: torch.Tensor = field(init=False)
    members: torch.Tensor = field(init=False)  # [members, sensors]: 1 where a member counts for a sensor

    def __post_init__(self) -> None:
        device = self.sae.W_enc.device
        self.features = torch.tensor([f for s in self.sensors for f in s.features], device=device)
        self.thresholds = torch.tensor([t for s in self.sensors for t in s.thresholds], device=device)
        owner = [k for k, s in enumerate(self.sensors) for _ in s.features]
        self.members = torch.zeros(len(owner), len(self.sensors), device=device)
        self.members[torch.arange(len(owner)), torch.tensor(owner)] = 1.0


@dataclass
class ClusterSensing:
    """One request's sensing clusters and, for each of its ``rows`` rows, how many members of each exceeded
    their thresholds at each of at most ``length`` response positions."""

    saes: dict[str, tuple[SAE, list[ClusterSensor]]]
    rows: int
    length: int
    device: torch.device
    on: dict[str, _OnSAE] = field(init=False)
    counts: torch.Tensor = field(init=False)  # [rows, length, sensors]
    written: dict[str, list[int]] = field(init=False)
    sensors: list[ClusterSensor] = field(init=False)

    def __post_init__(self) -> None:
        self.on, self.written, self.sensors = {}, {}, []
        for sae_id, (sae, sensors) in self.saes.items():
            self.on[sae_id] = _OnSAE(sae, sensors, len(self.sensors))
            self.written[sae_id] = [0] * self.rows
            self.sensors += sensors
        self.counts = torch.zeros(self.rows, self.length, len(self.sensors), device=self.device)

    def reader(self, sae_id: str, row: int) -> Callable[[torch.Tensor], None]:
        """The reader of ``row``'s fed response positions ``[1, T, d]`` at ``sae_id``'s layer."""
        return lambda hidden: self.read(sae_id, row, hidden)

    def read(self, sae_id: str, row: int, hidden: torch.Tensor) -> None:
        """Count, at each new position, each sensor's members whose activation exceeds their threshold."""
        on = self.on[sae_id]
        acts = on.sae.encode(hidden[0], on.features.to(hidden.device))
        over = (acts.float() > on.thresholds).float() @ on.members
        start = self.written[sae_id][row]
        end = min(start + over.shape[0], self.length)
        self.counts[row, start:end, on.first:on.first + len(on.sensors)] = over[:end - start].to(self.device)
        self.written[sae_id][row] = end

    def events(self) -> list[dict[str, Any]]:
        """Each row's firing of each cluster: the first response position where at least ``min_members`` of its
        members exceeded their thresholds, with how many did there (``score``)."""
        counts = self.counts.cpu()
        out = []
        for row in range(self.rows):
            for sae_id, on in self.on.items():
                read = self.written[sae_id][row]
                for k, sensor in enumerate(on.sensors):
                    column = counts[row, :read, on.first + k]
                    hits = (column >= sensor.min_members).nonzero()
                    if len(hits):
                        at = int(hits[0])
                        out.append({"cluster": sensor.name, "sae": sae_id, "index": row,
                                    "score": int(column[at]), "threshold": sensor.min_members, "position": at})
        return out


def sensing_for(attachments: Sequence[tuple[str, SAE, Mapping[str, ClusterSensor]]], rows: int, length: int,
                device: torch.device) -> ClusterSensing | None:
    """A request's sensing over the attached SAEs that have sensors (``(sae_id, sae, sensors)`` each); None when
    none has one, so a request reads nothing for it."""
    saes = {sae_id: (sae, list(sensors.values())) for sae_id, sae, sensors in attachments if sensors}
    return ClusterSensing(saes, rows, length, device) if saes else None
