"""The docs' screenshot (docs/steering/tui.md), made by driving the real app on the bundled model and its bundled SAE.

    python -m tui.screenshot docs/tui.svg

A temporary MILLM_HOME keeps the store untouched (the model cache is the usual one). The scene: the
bundled layer-10 SAE attached, its "ocean" feature found by label and set to 40 on the strength slider, watched by
monitoring, and a greedy answer with its tokens' top features on the strip.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

SAE = "smollm2-135m-res-L10"
FEATURE = 906
STRENGTH = "60"
PROMPT = "What should I do this weekend?"
SIZE = (150, 46)


async def scene(path: Path) -> None:
    from textual.widgets import Input

    from millm.local import engine_for
    from tui.app import MillmApp
    from tui.local import LocalClient
    from tui.widgets.activation_strip import ActivationStrip
    from tui.widgets.sae_list import SAEList
    from tui.widgets.strength_slider import StrengthSlider

    client = LocalClient(await asyncio.to_thread(engine_for, None))
    app = MillmApp(client=client, sampling={"temperature": "0", "max_tokens": "40", "seed": ""})

    async def idle() -> None:
        while True:
            await pilot.pause(0.05)
            if all(w.is_finished for w in app.workers):
                return

    async with app.run_test(size=SIZE) as pilot:
        await idle()
        saes = app.main.query_one(SAEList)
        saes.highlighted = [s.id for s in saes.saes].index(SAE)
        saes.focus()
        await pilot.press("a")
        await idle()
        await pilot.press("ctrl+f", *"ocean")
        await idle()
        await pilot.press("tab", "w", "enter")
        slid = app.main.query_one(StrengthSlider).feature
        assert slid is not None and slid.index == FEATURE, f"the label search found {slid}"
        await pilot.press(*STRENGTH, "enter")
        await idle()
        prompt = app.main.query_one("#prompt", Input)
        prompt.value = PROMPT
        prompt.focus()
        await pilot.press("enter")
        await idle()
        strip = app.main.query_one(ActivationStrip)
        strip.focus()
        await pilot.press(*["right"] * 3)
        await idle()
        app.main.query_one("#prompt", Input).focus()
        await idle()
        app.save_screenshot(path.name, str(path.parent))
        await client.detach(SAE)


def main() -> None:
    from millm.config import get_settings

    os.environ.setdefault("MILLM_CACHE", str(get_settings().cache_dir))
    os.environ["MILLM_HOME"] = tempfile.mkdtemp(prefix="millm-screenshot-")
    get_settings.cache_clear()
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/tui.svg").resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(scene(path))
    print(path)


if __name__ == "__main__":
    main()
