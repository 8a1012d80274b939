"""The TUI on the real bundled model, in-process: Pilot drives the app as a researcher would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from millm.steering.intensity import ENVELOPE, Symbol
from millm.steering.values import STRENGTH_LIMIT
from tests.tui.helpers import PROMPT, answers, ask, drive, greedy_answer, send, settle, type_text, until
from tui.client import Feature
from tui.widgets.activation_strip import ActivationStrip
from tui.widgets.compare_view import CompareView
from tui.widgets.intensity_dial import IntensityDial
from tui.widgets.message_box import MessageBox
from tui.widgets.monitor_panel import MonitorPanel
from tui.widgets.sae_list import SAEList
from tui.widgets.steered_list import SteeredList
from tui.widgets.strength_slider import StrengthSlider


def test_attach_search_and_slide_a_feature(engine, sae_id):
    from tui.local import LocalClient

    target = engine.steering_target()

    async def scenario(app, pilot) -> None:
        saes = app.main.query_one(SAEList)
        saes.highlighted = [s.id for s in saes.saes].index(sae_id)
        saes.focus()
        await pilot.press("a")
        await settle(pilot)
        assert target.steering.attachments[sae_id].layer == 12

        await pilot.press("ctrl+f")
        await type_text(pilot, "storm")
        await settle(pilot)
        found = app.main.query_one("#search").features
        assert [(f.index, f.label) for f in found] == [(5, "weather, storm, rain"), (9, "stormy seas")]
        await pilot.press("enter")  # the best match goes on the strength slider, which takes focus
        slider = app.main.query_one(StrengthSlider)
        assert slider.has_focus and slider.feature.index == 5

        async def values_after(*keys: str) -> dict[int, float]:
            await pilot.press(*keys)
            await settle(pilot)
            return dict(target.steering.attachments[sae_id].values)

        assert await values_after("right", "right") == {5: 10.0}
        assert await values_after("shift+right") == {5: 35.0}
        assert await values_after("left") == {5: 30.0}
        assert await values_after("1", "5", "0", "enter") == {5: 150.0}
        assert await values_after("5", "0", "0", "enter") == {5: STRENGTH_LIMIT}  # clamped as the hooks clamp
        assert await values_after("shift+right") == {5: STRENGTH_LIMIT}
        assert await values_after("minus", "9", "9", "9", "enter") == {5: -STRENGTH_LIMIT}
        steered = app.main.query_one(SteeredList)
        assert [(f.index, f.label) for f in steered.rows_shown] == [(5, "weather, storm, rain")]
        assert await values_after("0", "enter") == {}  # a typed 0 removes the feature
        assert steered.rows_shown == []
        await values_after("right")
        assert await values_after("delete") == {}

        saes.focus()
        await pilot.press("d")
        await settle(pilot)
        assert sae_id not in target.steering.attachments

    drive(LocalClient(engine), scenario)


def test_prompt_streams_its_answer(engine, monkeypatch):
    from tui.local import LocalClient

    expected = greedy_answer(engine, max_tokens=12)
    import time as _time

    from millm.engine.decode.scheduler import Scheduler

    forward = Scheduler._forward

    def paced(*args, **kwargs):  # each step of the one decode loop lasts long enough for the screen to show it
        _time.sleep(0.05)
        return forward(*args, **kwargs)

    monkeypatch.setattr(Scheduler, "_forward", paced)

    async def scenario(app, pilot) -> list[str]:
        await send(app, pilot, PROMPT)
        seen: list[str] = []
        await until(pilot, lambda: bool(app.main.query(MessageBox)))
        while app.main.busy:  # what the screen shows while the answer streams
            boxes = [b for b in app.main.query(MessageBox) if b.role != "you"]
            if boxes and boxes[-1].text and (not seen or seen[-1] != boxes[-1].text):
                seen.append(boxes[-1].text)
            await pilot.pause(0.005)
        await settle(pilot)
        assert answers(app) == [expected]
        assert app.main.conversation.turns[-1] == {"role": "assistant", "content": expected}
        return seen

    seen = drive(LocalClient(engine), scenario, {"temperature": "0", "max_tokens": "12"})
    assert len(seen) >= 2 and all(expected.startswith(s) for s in seen) and seen[0] != expected


def test_reset_forgets_the_history(engine):
    from tui.local import LocalClient

    async def scenario(app, pilot) -> None:
        await ask(app, pilot, "Hello")
        assert len(app.main.conversation.turns) == 2
        await ask(app, pilot, "/reset")
        assert app.main.conversation.turns == [] and answers(app) == []

    drive(LocalClient(engine), scenario)


def test_compare_mode_differs_only_under_steering(engine, attached):
    from tui.local import LocalClient

    target = engine.steering_target()

    async def compare(app, pilot) -> tuple[str, str]:
        view = app.main.query_one(CompareView)
        view.clear()
        await ask(app, pilot, PROMPT)
        return view.column("unsteered").answers()[-1], view.column("steered").answers()[-1]

    plain = greedy_answer(engine)

    async def scenario(app, pilot) -> None:
        await pilot.press("f3")
        off, on = await compare(app, pilot)
        assert off == on == plain
        target.steering.set_values(attached, {5: 150.0}, merge=False)
        off, on = await compare(app, pilot)
        assert off == plain and on != off
        view = app.main.query_one(CompareView)
        seeds = {str(b.border_subtitle) for side in ("unsteered", "steered")
                 for b in view.column(side).query(MessageBox) if b.role == "you"}
        assert len(seeds) == 1 and seeds.pop().startswith("seed ")

    drive(LocalClient(engine), scenario)


def test_intensity_dial_bounds_and_echo(engine, attached, settings):
    from tui.local import LocalClient

    plain = greedy_answer(engine)
    target = engine.steering_target()
    target.steering.set_values(attached, {5: 40.0}, merge=False)

    async def scenario(app, pilot) -> None:
        dial = app.main.query_one(IntensityDial)
        dial.focus()
        assert dial.dial is None
        await pilot.press(*["shift+right"] * 6)
        assert dial.dial == ENVELOPE[1]
        await pilot.press(*["shift+left"] * 6)
        assert dial.dial is Symbol.OFF
        await pilot.press("right")
        assert dial.dial == pytest.approx(0.1)
        await pilot.press("3", "enter")  # outside the envelope: refused, the dial stays
        assert dial.dial == pytest.approx(0.1)
        await pilot.press("n")
        assert dial.dial is Symbol.MIN
        await ask(app, pilot, PROMPT)
        assert dial.echoed == f"{settings.cluster_intensity_min:.1f}"  # live values scale like a cluster
        app.main.query_one(IntensityDial).focus()
        await pilot.press("x")
        await ask(app, pilot, PROMPT)
        assert dial.echoed == f"{settings.intensity_max:.1f}"
        app.main.query_one(IntensityDial).focus()
        await pilot.press("o")
        await ask(app, pilot, "/reset")
        await ask(app, pilot, PROMPT)
        assert dial.echoed == "0.0" and answers(app)[-1] == plain
        app.main.query_one(IntensityDial).focus()
        await pilot.press("b")
        assert dial.dial is None

    drive(LocalClient(engine), scenario)


def test_save_activate_and_export_a_profile(engine, attached, tmp_path, monkeypatch):
    from cli.common import steering_service
    from tui.local import LocalClient

    target = engine.steering_target()
    target.steering.set_values(attached, {5: 40.0, 7: -20.0}, merge=False)
    monkeypatch.chdir(tmp_path)

    async def scenario(app, pilot) -> None:
        await pilot.press("ctrl+s")
        await type_text(pilot, "tui-saved")
        await pilot.press("enter")
        await settle(pilot)
        entries = steering_service().store.profile("tui-saved")["entries"]
        assert sorted((e["feature"], e["strength"]) for e in entries) == [(5, 40.0), (7, -20.0)]

        target.steering.clear()
        await pilot.press("f2")
        await settle(pilot)
        table = app.screen.query_one("#profiles-table")
        row = [p.name for p in app.screen.rows].index("tui-saved")
        table.move_cursor(row=row)
        await pilot.press("a")
        await settle(pilot)
        assert target.steering.active_profile == "tui-saved"
        assert target.steering.attachments[attached].values == {5: 40.0, 7: -20.0}
        await pilot.press("e")
        await pilot.press("enter")  # the proposed file name
        await settle(pilot)
        doc = json.loads(Path(tmp_path / "tui-saved.profile.json").read_text())
        assert doc == steering_service().export("tui-saved")
        await pilot.press("l", "escape")
        await settle(pilot)
        assert app.main.loaded_profile == "tui-saved"

    try:
        drive(LocalClient(engine), scenario)
    finally:
        steering_service().delete_profile("tui-saved")


def test_escape_cancels_the_answer(engine):
    from tui.local import LocalClient

    async def scenario(app, pilot) -> None:
        await send(app, pilot, "Tell me a long story about the sea.")
        await until(pilot, lambda: any(b.text for b in app.main.query(MessageBox) if b.role != "you"))
        await pilot.press("escape")
        await settle(pilot)
        box = [b for b in app.main.query(MessageBox) if b.role != "you"][-1]
        assert box.border_subtitle == "cancelled" and box.has_class("stopped")
        assert app.main.conversation.turns == [] and not app.main.busy
        await ask(app, pilot, "Hello")  # the engine is free again
        assert answers(app)[-1] == greedy_answer(engine, "Hello", max_tokens=400)

    drive(LocalClient(engine), scenario, {"temperature": "0", "max_tokens": "400"})


def test_a_bad_sampling_value_is_refused_naming_the_field(engine):
    from tui.local import LocalClient

    async def scenario(app, pilot) -> Any:
        await ask(app, pilot, "Hello")
        box = [b for b in app.main.query(MessageBox) if b.role != "you"][-1]
        assert box.has_class("stopped") and "'temperature'" in box.text
        assert app.main.conversation.turns == []

    drive(LocalClient(engine), scenario, {"temperature": "7", "max_tokens": "8"})


def test_strip_and_sparklines_show_what_the_model_computed(engine, attached):
    from tui.local import LocalClient

    target = engine.steering_target()
    target.steering.set_values(attached, {5: 150.0}, merge=False)
    target.monitor.clear_history()  # the session's engine is shared: earlier tests' requests are not this app's

    async def scenario(app, pilot) -> None:
        await pilot.press("ctrl+f")
        await type_text(pilot, "storm")
        await settle(pilot)
        app.main.query_one("#search-results").focus()
        await pilot.press("w")  # watch feature 5
        await settle(pilot)
        assert target.monitor.config.features == [5] and target.monitor.config.sae == attached
        await ask(app, pilot, PROMPT)
        answer = answers(app)[-1]
        strip = app.main.query_one(ActivationStrip)
        assert strip.sae_id == attached and len(strip.tokens) >= 2
        assert answer.startswith("".join(t.text for t in strip.tokens))  # one entry per generated token, in order
        assert all(t.features and t.features == sorted(t.features, key=lambda f: -f[1]) for t in strip.tokens)
        strip.focus()
        await pilot.press("right")
        assert strip.cursor == 1
        await pilot.press("enter")  # the token's most active feature goes on the dial
        assert app.main.query_one(StrengthSlider).feature.index == strip.tokens[1].features[0][0]
        await settle(pilot)
        spark = app.main.query_one(MonitorPanel).query_one("#spark-5")
        assert len(spark.data) == len(target.monitor.history) >= 1
        assert spark.data[-1] == target.monitor.history[-1]["features"]["5"]["mean"]

    try:
        drive(LocalClient(engine), scenario)
    finally:
        target.monitor.configure(type(target.monitor.config)())


def test_a_dial_change_mid_answer_applies_between_steps(engine, attached):
    """The TUI is an operator: its change lands while the answer streams, and stays."""
    from tui.local import LocalClient

    target = engine.steering_target()

    async def scenario(app, pilot) -> None:
        app.main.query_one(StrengthSlider).show(Feature(attached, 5, ""), 0.0)
        await send(app, pilot, "Tell me a long story about the sea.")
        await until(pilot, lambda: any(b.text for b in app.main.query(MessageBox) if b.role != "you"))
        app.main.query_one(StrengthSlider).focus()
        await pilot.press("1", "5", "0", "enter")
        await until(pilot, lambda: target.steering.attachments[attached].values == {5: 150.0})
        assert app.main.busy  # applied between two decode steps, not after the answer
        await pilot.press("escape")
        await settle(pilot)
        assert target.steering.attachments[attached].values == {5: 150.0}

    drive(LocalClient(engine), scenario, {"temperature": "0", "max_tokens": "400"})


def test_the_bundled_sae_found_by_label_steers_the_answer(engine):
    from cli.common import steering_service
    from millm.sae.bundled import bundled_saes
    from tui.local import LocalClient

    bundled = next(b for b in bundled_saes() if b.id == "smollm2-135m-res-L10")
    plain = greedy_answer(engine, "What should I do this weekend?", max_tokens=12)
    target = engine.steering_target()

    async def scenario(app, pilot) -> str:
        saes = app.main.query_one(SAEList)
        saes.highlighted = [s.id for s in saes.saes].index(bundled.id)
        saes.focus()
        await pilot.press("a")
        await settle(pilot)
        assert target.steering.attachments[bundled.id].layer == bundled.layer
        await pilot.press("ctrl+f")
        await type_text(pilot, "ocean")
        await settle(pilot)
        await pilot.press("enter", "4", "0", "enter")
        await settle(pilot)
        assert target.steering.attachments[bundled.id].values == {906: 40.0}
        await ask(app, pilot, "What should I do this weekend?")
        return answers(app)[-1]

    try:
        steered = drive(LocalClient(engine), scenario, {"temperature": "0", "max_tokens": "12"})
    finally:
        service = steering_service()
        service.clear(target)
        if bundled.id in target.steering.attachments:
            service.detach(target, bundled.id)
    assert steered != plain
