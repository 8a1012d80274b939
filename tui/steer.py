"""The chat input's ``/steer FEATURE[=STRENGTH], …``: features set on the chosen SAE as ``--steer`` sets them.

A feature is an index or a label; a feature named without ``=STRENGTH`` takes its recommended strength. Names
and strengths go through the one rule the CLI's ``--steer`` uses (``LabelIndex.resolve_assignments``, which the
client runs in-process or the server runs for it: ``Client.resolve_steer``), so the TUI resolves, recommends and
refuses word for word as ``millm chat --steer`` does. Everything is resolved before anything is set: a refused
item changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from millm.errors import InvalidParameter
from millm.steering.values import check_values
from tui.client import Client, SAEInfo

COMMAND = "/steer"
USAGE = (f"{COMMAND} FEATURE[=STRENGTH], …: FEATURE is an index or a label; alone, it takes its recommended "
         "strength")


@dataclass(frozen=True)
class Steer:
    """What a ``/steer`` resolved to: ``{index: strength}`` on ``sae`` and the lines saying which recommended
    strengths were taken."""

    sae: SAEInfo
    values: dict[int, float]
    said: tuple[str, ...]

    def summary(self) -> str:
        """What the notification says: every value set, then which recommended strength each name alone took."""
        values = ", ".join(f"{index}={strength:g}" for index, strength in self.values.items())
        return "; ".join((f"{self.sae.name}: {values}", *self.said))


def items_of(text: str) -> list[str]:
    """The items after ``/steer``, split at commas (a label may hold spaces); refused when there are none."""
    items = [item.strip() for item in text.removeprefix(COMMAND).split(",") if item.strip()]
    if not items:
        raise InvalidParameter(f"Nothing to steer: {USAGE} (e.g. {COMMAND} weather, 123=40).", param="steer")
    return items


async def resolve(client: Client, sae: SAEInfo | None, items: list[str]) -> Steer:
    """``items`` on ``sae`` (the SAE list's choice), resolved and checked; refused, naming why, when no SAE is
    chosen, it is not attached, or an item names no feature or (alone) one with no recommended strength."""
    if sae is None:
        raise InvalidParameter(f"{COMMAND} sets features on the SAE chosen in the SAE list; register one first "
                               "(millm sae add).", param="sae")
    if sae.attached_layer is None:
        raise InvalidParameter(f"{sae.name} is not attached: attach it (a in the SAE list) before {COMMAND}.",
                               param="sae")
    values, said = await client.resolve_steer(sae.id, items)
    return Steer(sae, check_values(values, sae.d_sae, "steer"), tuple(said))
