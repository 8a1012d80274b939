"""The registered SAEs, which are attached and where; attach and detach from here."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from tui.client import SAEInfo


class SAEList(OptionList):
    """One line per registered SAE or vector set: ``●`` attached (at its layer) or ``○`` not; a vector set says
    how many vectors it holds where an SAE says its width."""

    BINDINGS = [
        Binding("a", "attach", "attach"),
        Binding("d", "detach", "detach"),
    ]

    class Attach(Message):
        """Attach this SAE at its layer hint."""

        def __init__(self, sae: SAEInfo) -> None:
            super().__init__()
            self.sae = sae

    class Detach(Message):
        def __init__(self, sae: SAEInfo) -> None:
            super().__init__()
            self.sae = sae

    class Chosen(Message):
        """The highlighted SAE changed: searches and read-outs use it."""

        def __init__(self, sae: SAEInfo) -> None:
            super().__init__()
            self.sae = sae

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.saes: list[SAEInfo] = []

    def show(self, saes: list[SAEInfo]) -> None:
        """Replace the list, keeping the highlighted SAE where it still exists."""
        keep = self.selected.id if self.selected is not None else None
        self.saes = saes
        self.set_options([Option(self._line(s), id=s.id) for s in saes])
        if not saes:
            return
        ids = [s.id for s in saes]
        attached = [i for i, s in enumerate(saes) if s.attached_layer is not None]
        self.highlighted = ids.index(keep) if keep in ids else (attached[0] if attached else 0)

    @staticmethod
    def _line(sae: SAEInfo) -> Text:
        width = f" {sae.d_sae} vector{'s' if sae.d_sae != 1 else ''}" if sae.vectors else f" ×{sae.d_sae}"
        if sae.attached_layer is not None:
            return Text.assemble(("● ", "bold green"), (sae.name, "bold"), (f" L{sae.attached_layer}", "green"),
                                 (width, "dim"), overflow="ellipsis", no_wrap=True)
        hint = f" hint L{sae.layer_hint}" if sae.layer_hint is not None else " no layer hint"
        return Text.assemble(("○ ", "dim"), sae.name, (hint, "dim"), (width, "dim"), overflow="ellipsis",
                             no_wrap=True)

    @property
    def selected(self) -> SAEInfo | None:
        index = self.highlighted
        return self.saes[index] if index is not None and 0 <= index < len(self.saes) else None

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        if self.selected is not None:
            self.post_message(self.Chosen(self.selected))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        """Enter toggles: attach a detached SAE, detach an attached one."""
        event.stop()
        sae = self.selected
        if sae is not None:
            self.post_message(self.Detach(sae) if sae.attached_layer is not None else self.Attach(sae))

    def action_attach(self) -> None:
        if self.selected is not None:
            self.post_message(self.Attach(self.selected))

    def action_detach(self) -> None:
        if self.selected is not None:
            self.post_message(self.Detach(self.selected))
