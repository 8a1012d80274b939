"""Monitoring's watched features as sparklines: one point per answer, the feature's mean activation."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, Sparkline

from tui.client import Feature

POINTS = 40


def series(history: list[dict[str, Any]], feature: int, stat: str = "mean") -> list[float]:
    """The last POINTS values of ``stat`` for ``feature`` across monitoring's per-answer history."""
    values = [float(entry["features"][str(feature)][stat]) for entry in history
              if str(feature) in entry.get("features", {})]
    return values[-POINTS:]


class MonitorPanel(Vertical):
    """A sparkline per watched feature (w on a search result or a steered feature watches it)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.watched: list[Feature] = []

    def compose(self) -> ComposeResult:
        yield Label("w on a feature watches it: its mean activation per answer, before steering", classes="hint")

    def watch_features(self, features: list[Feature]) -> None:
        """Show one (empty) row per watched feature."""
        self.watched = features
        self.remove_children()
        if not features:
            self.mount(Label("w on a feature watches it: its mean activation per answer, before steering",
                             classes="hint"))
            return
        for f in features:
            row = Horizontal(Label(f"#{f.index} {f.label}"[:24], classes="name"), Sparkline([], id=f"spark-{f.index}"),
                             Label("", id=f"last-{f.index}", classes="last"), classes="spark-row")
            self.mount(row)

    def update_history(self, history: list[dict[str, Any]]) -> None:
        for f in self.watched:
            data = series(history, f.index)
            for spark in self.query(f"#spark-{f.index}").results(Sparkline):
                spark.data = data
            for last in self.query(f"#last-{f.index}").results(Label):
                last.update(f"{data[-1]:.2f}" if data else "-")
