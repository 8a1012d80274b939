"""The TUI's sweep (``s`` on the strength slider) and the slider's ⇧ step from a feature's recommended strength."""

from __future__ import annotations

import asyncio
import dataclasses
import io
from typing import TYPE_CHECKING

from rich.console import Console

from millm.sae.cards import FeatureCard
from millm.sae.measured import HeldOut
from tests.support.cards import measured
from tests.tui.fakes import LABELS, SAE, ScriptedClient
from tests.tui.helpers import drive, settle, type_text
from tui.controls import STRENGTH_LARGE_STEP, large_step
from tui.screens.sweep import SweepScreen, sweep_view
from tui.widgets.strength_slider import StrengthSlider

if TYPE_CHECKING:
    from millm.research.sweep import SweepResult

THUNDER = 301  # "storm, thunder"


def swept(feature: int) -> SweepResult:
    from millm.research.measure import Point
    from millm.research.sweep import SweepResult

    result = SweepResult(SAE, 10, feature, LABELS[feature], ("storm", "thunder"), 4, 24, 0, 0.0, -1.9)
    result.points = [Point(0.0, 0.0, -1.9, 0.0, True, "A calm day."), Point(40.0, 0.75, -2.7, -0.8, True, "Thunder!"),
                     Point(80.0, 1.0, -4.0, -2.1, False, "storm storm")]
    result.held_out = HeldOut.from_json(measured(40.0)["held_out"])  # 50% [30%-69%] of 16 held-out answers
    return result


class MeasuredClient(ScriptedClient):
    """Feature 301 was measured to steer at 40; a sweep answers a fixed table."""

    def __init__(self) -> None:
        super().__init__()
        self.swept: list[tuple[str, int]] = []

    async def feature(self, sae_id: str, index: int) -> FeatureCard:
        card = await super().feature(sae_id, index)
        return dataclasses.replace(card, held_out=HeldOut.from_json(measured(40.0)["held_out"])) if index == THUNDER \
            else card

    async def sweep(self, sae_id: str, index: int) -> SweepResult:
        self.swept.append((sae_id, index))
        return swept(index)


def test_large_step_is_the_recommended_strength():
    assert large_step(None) == STRENGTH_LARGE_STEP and large_step(0.0) == STRENGTH_LARGE_STEP
    assert large_step(40.0) == 40.0 and large_step(-60.0) == 60.0 and large_step(900.0) == 200.0


def test_the_slider_steps_by_the_recommended_strength_and_s_sweeps():
    client = MeasuredClient()

    async def scenario(app, pilot) -> None:
        await pilot.press("ctrl+f")
        await type_text(pilot, "thunder")
        await asyncio.sleep(0.3)
        await settle(pilot)
        await pilot.press("enter")
        await settle(pilot)
        slider = app.main.query_one(StrengthSlider)
        assert slider.feature.index == THUNDER and slider.recommended == 40.0
        assert "recommended 40, held-out 50% [30%-69%] of 16 answers at 40" in str(slider.render())
        await pilot.press("shift+right")
        await settle(pilot)
        assert client.values[SAE][THUNDER] == 40.0  # one ⇧→ from 0 lands on the recommended strength
        await pilot.press("s")
        await settle(pilot)
        assert client.swept == [(SAE, THUNDER)] and isinstance(app.screen, SweepScreen)
        console = Console(width=120, record=True, file=io.StringIO())
        console.print(sweep_view(app.screen.result))
        text = console.export_text()
        assert "recommended strength: 40" in text and "75%" in text and "-2.10" in text
        assert "held-out 50% [30%-69%] of 16 answers at 40" in text
        await pilot.press("escape")
        await settle(pilot)
        assert not isinstance(app.screen, SweepScreen) and not app.main.busy
        await pilot.press("ctrl+f")  # another feature: no measured strength, the usual step
        await type_text(pilot, "ocean")
        await asyncio.sleep(0.3)
        await settle(pilot)
        await pilot.press("enter")
        await settle(pilot)
        assert slider.feature.index == 40 and slider.recommended is None

    drive(client, scenario)


def test_sweep_refused_by_a_remote_client():
    import pytest

    from millm.errors import InvalidParameter
    from tui.remote import RemoteClient

    client = RemoteClient.__new__(RemoteClient)
    with pytest.raises(InvalidParameter, match="without --url"):
        asyncio.run(client.sweep(SAE, 3))


def test_local_client_sweeps_on_the_engine_thread_and_leaves_nothing(engine, monkeypatch):
    from cli.common import steering_service
    from millm.sae.bundled import register_bundled
    from tui.local import LocalClient

    monkeypatch.setattr("tui.local.SWEEP_STRENGTHS", (0.0, 40.0))
    monkeypatch.setattr("tui.local.SWEEP_PROMPTS", 1)
    monkeypatch.setattr("tui.local.SWEEP_TOKENS", 4)
    service = steering_service()
    register_bundled(service.store)
    before = engine.steering.snapshot()
    client = LocalClient(engine, service)
    try:
        result = asyncio.run(client.sweep("smollm2-135m-res-L10", 2375))
    finally:
        asyncio.run(client.close())
    assert result.label == "music, melody" and result.words == ("music", "melody")
    assert [p.strength for p in result.points] == [0.0, 40.0] and result.points[0].rate == result.unsteered_rate
    assert engine.steering.snapshot() == before and "smollm2-135m-res-L10" not in engine.steering.attachments
