"""The features steered now, across the attached SAEs, with their strengths."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable

from tui.client import Feature, SteeringState

LABEL_WIDTH = 16


def steered_rows(state: SteeringState) -> list[tuple[str, int, float]]:
    """Every live value as (SAE, feature, strength), by the SAE's layer (then its id), then feature."""
    return [(sae_id, index, strength) for sae_id in sorted(state.values, key=lambda s: (state.layers.get(s, 0), s))
            for index, strength in sorted(state.values[sae_id].items())]


class SteeredList(DataTable[Text]):
    """One row per steered feature: layer, index, label, strength. Enter puts it on the dial, i shows its card."""

    BINDINGS = [
        Binding("delete,backspace", "remove", "remove"),
        Binding("w", "watch", "watch"),
        Binding("i", "card", "feature card"),
    ]

    class Chosen(Message):
        def __init__(self, feature: Feature) -> None:
            super().__init__()
            self.feature = feature

    class Remove(Message):
        """Set this feature's strength to 0, which removes it."""

        def __init__(self, feature: Feature) -> None:
            super().__init__()
            self.feature = feature

    class Watch(Message):
        def __init__(self, feature: Feature) -> None:
            super().__init__()
            self.feature = feature

    class Card(Message):
        """Show a feature's card."""

        def __init__(self, feature: Feature) -> None:
            super().__init__()
            self.feature = feature

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=False)
        self.rows_shown: list[Feature] = []

    def on_mount(self) -> None:
        self.add_column("L", width=3)
        self.add_column("feature", width=7)
        self.add_column("label", width=LABEL_WIDTH)
        self.add_column("strength", width=8, key="strength")

    @staticmethod
    def _strength(strength: float) -> Text:
        return Text(f"{strength:+.1f}", style="bold green" if strength > 0 else "bold red", justify="right")

    def show(self, state: SteeringState, labels: dict[str, dict[int, str]]) -> None:
        """Rows for every non-zero value, by layer then feature; the cursor stays on its feature. When only
        strengths changed, only their cells are redrawn (a held arrow key sends many)."""
        rows = steered_rows(state)
        if self._shows(rows, labels):
            for sae_id, index, strength in rows:
                self.update_cell(f"{sae_id}:{index}", "strength", self._strength(strength))
            return
        keep = self.current()
        self.clear()
        self.rows_shown = []
        for sae_id, index, strength in rows:
            layer = state.layers.get(sae_id)
            label = labels.get(sae_id, {}).get(index, "")
            self.rows_shown.append(Feature(sae_id, index, label))
            self.add_row(Text(str(layer) if layer is not None else "-", style="dim"), Text(f"#{index}"),
                         Text(label or "-", overflow="ellipsis", no_wrap=True), self._strength(strength),
                         key=f"{sae_id}:{index}")
        if keep is not None:
            self._move_to(keep)

    def _shows(self, rows: list[tuple[str, int, float]], labels: dict[str, dict[int, str]]) -> bool:
        """Whether the table shows these rows' features, in this order, with these labels."""
        return [(f.sae_id, f.index) for f in self.rows_shown] == [(sae, index) for sae, index, _ in rows] and \
            all(f.label == labels.get(f.sae_id, {}).get(f.index, "") for f in self.rows_shown)

    def _move_to(self, feature: Feature) -> None:
        """The cursor onto ``feature``'s row, where it has one."""
        for row, shown in enumerate(self.rows_shown):
            if (shown.sae_id, shown.index) == (feature.sae_id, feature.index):
                self.move_cursor(row=row)

    def current(self) -> Feature | None:
        row = self.cursor_row
        return self.rows_shown[row] if 0 <= row < len(self.rows_shown) else None

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if (feature := self.current()) is not None:
            self.post_message(self.Chosen(feature))

    def action_remove(self) -> None:
        if (feature := self.current()) is not None:
            self.post_message(self.Remove(feature))

    def action_watch(self) -> None:
        if (feature := self.current()) is not None:
            self.post_message(self.Watch(feature))

    def action_card(self) -> None:
        if (feature := self.current()) is not None:
            self.post_message(self.Card(feature))
