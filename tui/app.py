"""``millm tui``: the Textual app. It connects a client (in-process or a server's URL), then shows the
steering screen; F1 lists every key.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from textual import work
from textual.app import App
from textual.binding import Binding

from millm.errors import MillmError
from tui.client import Client
from tui.screens.help import HelpScreen, Section
from tui.screens.loading import LoadingScreen
from tui.screens.main import CHAT_COMMANDS, MainScreen
from tui.screens.profiles import ProfilesScreen
from tui.widgets.activation_strip import ActivationStrip
from tui.widgets.feature_search import FeatureResults
from tui.widgets.intensity_dial import IntensityDial
from tui.widgets.sae_list import SAEList
from tui.widgets.steered_list import SteeredList
from tui.widgets.strength_slider import StrengthSlider

Opener = Callable[[], Awaitable[Client]]


class MillmApp(App[None]):
    """The TUI: give it a connected ``client``, or an ``opener`` that connects one (shown as it loads)."""

    CSS_PATH = "app.tcss"
    TITLE = "miLLM"
    BINDINGS = [
        Binding("f1", "help", "help"),
        Binding("ctrl+q", "quit", "quit"),
    ]

    def __init__(self, client: Client | None = None, opener: Opener | None = None, what: str = "connecting",
                 sampling: dict[str, str] | None = None) -> None:
        super().__init__()
        if (client is None) == (opener is None):
            raise ValueError("give a client or an opener")
        self.client = client
        self.opener = opener
        self.what = what
        self.sampling = sampling

    async def on_mount(self) -> None:
        if self.client is not None:
            await self.start(self.client)
        else:
            await self.push_screen(LoadingScreen(self.what))
            self.connect()

    @work(exclusive=True, group="connect")
    async def connect(self) -> None:
        assert self.opener is not None
        try:
            client = await self.opener()
        except MillmError as exc:
            screen = self.screen
            if isinstance(screen, LoadingScreen):
                screen.failed(exc.message)
            return
        self.client = client
        await self.start(client)

    async def start(self, client: Client) -> None:
        info = await client.info()
        main = MainScreen(client, info, self.sampling)
        if isinstance(self.screen, LoadingScreen):
            await self.switch_screen(main)
        else:
            await self.push_screen(main)

    @property
    def main(self) -> MainScreen:
        """The steering screen (what tests and the bench drive)."""
        for screen in self.screen_stack:
            if isinstance(screen, MainScreen):
                return screen
        raise LookupError("the steering screen is not shown yet")

    def key_sections(self) -> list[Section]:
        """Every key, by where it works."""
        return [("anywhere", self.BINDINGS), ("main screen", MainScreen.BINDINGS),
                ("SAE list", SAEList.BINDINGS), ("search results", FeatureResults.BINDINGS),
                ("steered list", SteeredList.BINDINGS), ("strength slider", StrengthSlider.BINDINGS),
                ("intensity dial", IntensityDial.BINDINGS), ("token strip", ActivationStrip.BINDINGS),
                ("profiles", ProfilesScreen.BINDINGS)]

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            typing = [("strength slider", "digits Enter", StrengthSlider.TYPING),
                      ("intensity dial", "digits Enter", IntensityDial.TYPING)]
            self.push_screen(HelpScreen(self.key_sections(),
                                        [("chat input", k, does) for k, does in CHAT_COMMANDS.items()] + typing))

    async def on_unmount(self) -> None:
        if self.client is not None:
            await self.client.close()


def run(model: str | None = None, url: str | None = None) -> None:
    """Run the TUI in-process on ``model``, or against the server at ``url``."""
    if url is not None:
        from tui.remote import RemoteClient

        def remote() -> Awaitable[Client]:
            return RemoteClient.open(url, model)

        MillmApp(opener=remote, what=f"connecting to {url}").run()
    else:
        from millm.config import get_settings
        from tui.local import LocalClient

        def local() -> Awaitable[Client]:
            return LocalClient.open(model)

        MillmApp(opener=local, what=f"loading {model or get_settings().default_model}").run()
