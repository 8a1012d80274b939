"""Every feature label the steering screen has seen, per SAE, and how a missing one is read.

The screen holds one book and hands it to the pane that searches features; both read labels through it, so
each label is asked for once however many lists show it.
"""

from __future__ import annotations

from millm.errors import MillmError
from tui.client import Client, SAEInfo


class LabelBook:
    """Labels per SAE: every label of an attached SAE (read once), and others read by index as they are shown."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.labels: dict[str, dict[int, str]] = {}  # every label seen, per SAE
        self._read: set[str] = set()  # SAEs whose labels were all read
        self._asked: set[tuple[str, int]] = set()  # features whose label was asked for by index

    def of(self, sae_id: str | None) -> dict[int, str]:
        """The labels seen of ``sae_id`` (none for no SAE)."""
        return self.labels.get(sae_id, {}) if sae_id else {}

    def add(self, sae_id: str, labels: dict[int, str]) -> None:
        self.labels.setdefault(sae_id, {}).update(labels)

    async def read_attached(self, saes: list[SAEInfo]) -> None:
        """Every label of each attached SAE not read yet."""
        for sae in saes:
            if sae.attached_layer is not None and sae.id not in self._read:
                self.add(sae.id, await self.client.labels(sae.id))
                self._read.add(sae.id)

    async def label_of(self, sae_id: str, index: int) -> str:
        """A feature's label: known already, or read from its card (a remote server lists only its first
        labels, so the others come by index from ``GET /api/saes/{id}/features/{index}``)."""
        known = self.labels.get(sae_id, {}).get(index)
        if known or (sae_id, index) in self._asked:
            return known or ""
        self._asked.add((sae_id, index))
        try:
            label = (await self.client.feature(sae_id, index)).label
        except MillmError:
            return ""
        if label:
            self.labels.setdefault(sae_id, {})[index] = label
        return label

    def missing(self, features: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """The features (once each) whose label is not known and was not asked for yet."""
        return [(sae, i) for sae, i in dict.fromkeys(features)
                if not self.labels.get(sae, {}).get(i) and (sae, i) not in self._asked]
