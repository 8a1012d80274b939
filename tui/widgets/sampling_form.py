"""The sampling settings sent with each answer: temperature, max tokens, seed."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Input, Label

FIELDS = (("temperature", "temperature", "0-2"), ("max_tokens", "max tokens", "default"), ("seed", "seed", "random"))


class SamplingForm(Horizontal):
    """Three small fields; an empty one is left out of the request (the server's default)."""

    def __init__(self, defaults: dict[str, str] | None = None, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.defaults = defaults or {}

    def compose(self) -> ComposeResult:
        for name, label, hint in FIELDS:
            yield Label(label)
            yield Input(self.defaults.get(name, ""), placeholder=hint, id=f"sampling-{name}", compact=True)

    def fields(self) -> dict[str, str]:
        """The fields as typed (checked when the request is built)."""
        return {name: self.query_one(f"#sampling-{name}", Input).value for name, _, _ in FIELDS}
