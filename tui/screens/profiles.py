"""Saved profiles: save the live values as one, load one for this session's chats, activate, export.

Loading steers this session's answers with the profile (the request's ``profile`` field), leaving the
live values as they are; activating makes the profile's values the live values for every client.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Label

from millm.errors import MillmError
from millm.paths import user_path
from tui.client import Client, ProfileInfo
from tui.screens.prompt import TextPrompt


class ProfileActions(Screen[None]):
    """Save the live values as a profile (ctrl+s) and the profiles dialog (F2), for a screen that says what to
    do once a profile is loaded for chats (``profile_changed``)."""

    client: Client
    loaded_profile: str | None

    def profile_changed(self, loaded: str | None, values_changed: bool) -> None:
        raise NotImplementedError

    def action_save_profile(self) -> None:
        self.app.push_screen(TextPrompt("Save the live values as a profile named:"), self._save_profile)

    def _save_profile(self, name: str | None) -> None:
        if name:
            self.save_profile(name)

    @work(group="profiles")
    async def save_profile(self, name: str) -> None:
        try:
            await self.client.save_profile(name)
        except MillmError as exc:
            self.notify(exc.message, severity="error", title="not saved")
            return
        self.notify(f"saved profile {name}")

    def action_profiles(self) -> None:
        self.app.push_screen(ProfilesScreen(self.client, self.loaded_profile), self._profiles_closed)

    def _profiles_closed(self, outcome: ProfilesOutcome | None) -> None:
        if outcome is not None:
            self.profile_changed(outcome.loaded, outcome.changed)


@dataclass(frozen=True)
class ProfilesOutcome:
    """What the dialog changed: the profile loaded for chats, and whether the live values changed."""

    loaded: str | None
    changed: bool


class ProfilesScreen(ModalScreen[ProfilesOutcome]):
    """The profile store, one row per profile."""

    BINDINGS = [
        Binding("s", "save", "save live values as…"),
        Binding("l", "load", "load / unload for chats"),
        Binding("a", "activate", "activate"),
        Binding("e", "export", "export to file"),
        Binding("escape", "close", "close"),
    ]

    def __init__(self, client: Client, loaded: str | None) -> None:
        super().__init__()
        self.client = client
        self.loaded = loaded
        self.changed = False
        self.rows: list[ProfileInfo] = []
        self.active: str | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="profiles-box"):
            yield Label("profiles · s save · l load for chats · a activate · e export · Esc close", classes="hint")
            yield DataTable(id="profiles-table", cursor_type="row")

    def on_mount(self) -> None:
        self.query_one("#profiles-box").border_title = "profiles"
        self.query_one(DataTable).add_columns("", "name", "entries", "model", "description")
        self.reload()

    @work(exclusive=True, group="profiles")
    async def reload(self) -> None:
        try:
            self.rows, self.active = await self.client.profiles()
        except MillmError as exc:
            self.notify(exc.message, severity="error")
            return
        table = self.query_one(DataTable)
        keep = table.cursor_row
        table.clear()
        for p in self.rows:
            marks = ("●" if p.name == self.active else " ") + ("▸" if p.name == self.loaded else " ")
            table.add_row(Text(marks, style="bold green"), Text(p.name, style="bold"), str(p.entries), p.model or "-",
                          Text(p.description, overflow="ellipsis", no_wrap=True))
        if self.rows:
            table.move_cursor(row=min(keep, len(self.rows) - 1))

    def current(self) -> ProfileInfo | None:
        row = self.query_one(DataTable).cursor_row
        return self.rows[row] if 0 <= row < len(self.rows) else None

    def action_close(self) -> None:
        self.dismiss(ProfilesOutcome(self.loaded, self.changed))

    def action_save(self) -> None:
        self.app.push_screen(TextPrompt("Save the live values as a profile named:"), self._save)

    def _save(self, name: str | None) -> None:
        if name:
            self.save(name)

    @work(group="profiles-change")
    async def save(self, name: str) -> None:
        try:
            await self.client.save_profile(name)
        except MillmError as exc:
            self.notify(exc.message, severity="error", title="not saved")
            return
        self.notify(f"saved profile {name}")
        self.reload()

    def action_load(self) -> None:
        if (p := self.current()) is not None:
            self.loaded = None if self.loaded == p.name else p.name
            self.notify(f"chats now use profile {p.name}" if self.loaded else f"chats no longer use {p.name}")
            self.reload()

    def action_activate(self) -> None:
        if (p := self.current()) is not None:
            self.activate(p.name)

    @work(group="profiles-change")
    async def activate(self, name: str) -> None:
        try:
            await self.client.activate(name)
        except MillmError as exc:
            self.notify(exc.message, severity="error", title="not activated")
            return
        self.changed = True
        self.notify(f"activated {name}: its values are the live values")
        self.reload()

    def action_export(self) -> None:
        if (p := self.current()) is not None:
            self.app.push_screen(TextPrompt(f"Export {p.name} to file:", f"{p.name}.profile.json"),
                                 lambda path: self._export(p.name, path))

    def _export(self, name: str, path: str | None) -> None:
        if path:
            self.export(name, path)

    @work(group="profiles-change")
    async def export(self, name: str, path: str) -> None:
        try:
            doc = await self.client.export(name)
            target = user_path(path)
            target.write_text(json.dumps(doc, indent=2) + "\n")
        except MillmError as exc:
            self.notify(exc.message, severity="error", title="not exported")
            return
        except OSError as exc:
            self.notify(f"{path}: {exc.strerror or exc}", severity="error", title="not exported")
            return
        self.notify(f"exported {name} to {target}")
