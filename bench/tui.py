"""The TUI's speed, driven by Textual's Pilot on the bundled model, in one run.

    python bench/tui.py [--rounds 5] [--tokens 32] [--d-sae 8192]

1. A slider or dial change to the first token of the next answer, against a plain request in the same run:
   the strength slider's key press (an engine command that rewrites the SAE's delta buffer and persists
   the value) then Enter, versus Enter alone, both timed to the first token on screen; the extra is
   printed in decode steps (the issue's bound: no more than one). The intensity dial is timed the same
   way (its λ travels with the request).
2. Redraw latency while an answer streams: a key press on the strength slider and on the intensity dial,
   timed from the press to the first screen update after the control re-rendered (the issue's bound:
   < 50 ms).

The store is a temporary MILLM_HOME; the model cache is the usual one. The SAE is random (its cost does
not depend on what it learned).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from millm.config import get_settings  # noqa: E402

_cache = get_settings().cache_dir
os.environ.setdefault("MILLM_CACHE", str(_cache))
os.environ["MILLM_HOME"] = tempfile.mkdtemp(prefix="millm-bench-tui-")
get_settings.cache_clear()

import torch  # noqa: E402

from millm.sae.model import SAE  # noqa: E402

PROMPT = "Once upon a time, in a village by the sea, there lived"
LAYER = 10


def random_sae(d_in: int, d_sae: int, seed: int = 0) -> SAE:
    g = torch.Generator().manual_seed(seed)
    W_dec = torch.nn.functional.normalize(torch.randn(d_sae, d_in, generator=g), dim=-1)
    return SAE(W_enc=W_dec.T.contiguous(), b_enc=torch.zeros(d_sae), W_dec=W_dec, b_dec=torch.zeros(d_in))


def write_sae(folder: Path, sae: SAE) -> Path:
    import json

    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({"W_enc": sae.W_enc, "b_enc": sae.b_enc, "W_dec": sae.W_dec, "b_dec": sae.b_dec},
              str(folder / "sae_weights.safetensors"))
    (folder / "cfg.json").write_text(json.dumps({
        "architecture": "standard", "d_in": sae.d_in, "d_sae": sae.d_sae, "apply_b_dec_to_input": False,
        "normalize_activations": "none", "metadata": {"hook_name": f"blocks.{LAYER}.hook_resid_post",
                                                      "sae_lens_version": "6.0.0"}}))
    return folder


class Clock:
    """First-piece times of answers, and screen updates, as the app produces them."""

    def __init__(self, app: Any) -> None:
        from tui.widgets.message_box import MessageBox

        self.pieces: list[float] = []
        self.displays: list[float] = []
        original_append = MessageBox.append
        clock = self

        def append(box: MessageBox, piece: str) -> None:
            clock.pieces.append(time.perf_counter())
            original_append(box, piece)

        setattr(MessageBox, "append", append)  # noqa: B010  (time every piece the screen shows)
        original_display = app._display

        def display(screen: Any, renderable: Any) -> None:
            if renderable is not None:
                clock.displays.append(time.perf_counter())
            original_display(screen, renderable)

        app._display = display


def key(app: Any, name: str) -> None:
    """A key press as the terminal driver delivers one (Pilot's press waits for the whole process to go
    idle, which it never does while the engine thread decodes, so it cannot time anything)."""
    from textual import events

    app.post_message(events.Key(name, name if len(name) == 1 else None))


async def first_piece(app: Any, clock: Clock, keys: list[str]) -> tuple[float, list[float]]:
    """Time from the first of ``keys`` to the answer's first piece on screen; and the answer's piece times."""
    main = app.main
    main.conversation.reset()
    main.query_one("#prompt").value = PROMPT
    clock.pieces.clear()
    start = time.perf_counter()
    for name in keys:
        key(app, name)
    while not clock.pieces:
        if time.perf_counter() - start > 120:
            raise TimeoutError(f"no answer to {keys}: focus {app.focused}, busy {main.busy!r}")
        await asyncio.sleep(0.0005)
    first = clock.pieces[0] - start
    while main.busy:
        await asyncio.sleep(0.01)
    return first, list(clock.pieces)


async def redraw(clock: Clock, app: Any, widget: Any, name: str) -> float:
    """Press ``name`` on the focused ``widget``; time to the first screen update after it re-rendered."""
    rendered: list[float] = []
    original = widget.render

    def render() -> Any:
        rendered.append(time.perf_counter())
        return original()

    widget.render = render
    start = time.perf_counter()
    key(app, name)
    while not rendered or not [t for t in clock.displays if t > rendered[0]]:
        await asyncio.sleep(0.0005)
    widget.render = original
    return min(t for t in clock.displays if t > rendered[0]) - start


async def bench(args: argparse.Namespace) -> None:
    from textual.widgets import Input

    from cli.common import engine_for, steering_service
    from tests.tui.helpers import settle
    from tui.app import MillmApp
    from tui.client import Feature
    from tui.local import LocalClient
    from tui.widgets.intensity_dial import IntensityDial
    from tui.widgets.strength_slider import StrengthSlider

    engine = engine_for(None)
    service = steering_service()
    folder = write_sae(Path(os.environ["MILLM_HOME"]) / "sae", random_sae(576, args.d_sae))
    sae_id = service.register_sae(folder, name="bench")["id"]
    target = engine.steering_target()
    assert target is not None
    service.attach(target, sae_id, LAYER)

    app = MillmApp(client=LocalClient(engine), sampling={"temperature": "0", "max_tokens": str(args.tokens)})
    async with app.run_test(size=(140, 44)) as pilot:
        await settle(pilot)
        clock = Clock(app)
        strength, intensity = app.main.query_one(StrengthSlider), app.main.query_one(IntensityDial)
        strength.show(Feature(sae_id, 123), 0.0)

        async def focused(widget: Any) -> None:
            widget.focus()
            await pilot.pause()
            await settle(pilot)

        plain, dialled, lam_plain, lam, steps = [], [], [], [], []
        for round_ in range(args.rounds + 1):  # the first is a warm-up
            await focused(strength)
            first, pieces = await first_piece(app, clock, ["ctrl+t", "enter"])
            await focused(strength)
            dial_first, _ = await first_piece(app, clock, ["right", "ctrl+t", "enter"])
            await focused(intensity)
            lam_base, _ = await first_piece(app, clock, ["ctrl+t", "enter"])
            await focused(intensity)
            lam_first, _ = await first_piece(app, clock, ["left", "ctrl+t", "enter"])
            if round_:
                plain.append(first)
                steps += [b - a for a, b in zip(pieces[1:], pieces[2:])]
                dialled.append(dial_first)
                lam_plain.append(lam_base)
                lam.append(lam_first)
        step = statistics.median(steps)
        target.steering.clear()

        await focused(app.main.query_one("#prompt"))
        app.main.query_one("#sampling-max_tokens", Input).value = str(args.tokens * 8)
        app.main.query_one("#prompt", Input).value = PROMPT
        clock.pieces.clear()
        key(app, "enter")
        while not clock.pieces:
            await asyncio.sleep(0.005)
        strength_redraws: list[float] = []
        intensity_redraws: list[float] = []
        strength.focus()
        while app.main.busy and len(strength_redraws) < args.rounds * 4:  # alternate: every press changes it
            strength_redraws.append(await redraw(clock, app, strength,
                                                 "right" if len(strength_redraws) % 2 else "left"))
            await asyncio.sleep(0.05)
        intensity.focus()
        while app.main.busy and len(intensity_redraws) < args.rounds * 4:
            intensity_redraws.append(await redraw(clock, app, intensity,
                                                  "right" if len(intensity_redraws) % 2 else "left"))
            await asyncio.sleep(0.05)
        key(app, "escape")
        await settle(pilot, timeout=600)

    def line(name: str, values: list[float], base: list[float] | None = None) -> str:
        med = statistics.median(values)
        text = f"{name:<46} median {med * 1000:6.1f} ms  min {min(values) * 1000:6.1f} ms"
        if base is not None:
            extra = med - statistics.median(base)
            text += f"  extra {extra * 1000:+6.1f} ms = {extra / step:+.2f} decode steps (bound: <= 1)"
        return text

    print(f"model {engine.model_id}, SAE d_sae={args.d_sae} on layer {LAYER}, {args.rounds} rounds, "
          f"{args.tokens} tokens, greedy")
    print(line("one decode step, on screen", steps))
    print(line("strength slider focused: ^T Enter -> 1st token", plain))
    print(line("  a strength step first: → ^T Enter", dialled, plain))
    print(line("intensity dial focused: ^T Enter -> 1st token", lam_plain))
    print(line("  a λ step first: ← ^T Enter", lam, lam_plain))
    for name, values in (("strength", strength_redraws), ("intensity", intensity_redraws)):
        if values:
            print(line(f"redraw while streaming, {name} key", values)
                  + f"  max {max(values) * 1000:.1f} ms over {len(values)} presses (bound: < 50 ms)")
    service.detach(target, sae_id)


def main() -> None:
    import faulthandler

    faulthandler.dump_traceback_later(900, exit=True)  # a stuck run says where, rather than hanging
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--d-sae", type=int, default=8192)
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
