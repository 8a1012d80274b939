"""Acting on a row's probes while it decodes: an armed probe (``abort``, ``steer``) that reached its threshold in
the forward just run acts once, before the token sampled from that forward is taken.

``abort`` ends the row there with ``content_filter`` (OpenAI's value for withheld output): the text so far is
kept (what was held back for a stop sequence too) and the token just sampled is dropped. ``steer`` hands back
the profile's steering for the scheduler to bind to that row's slot, so the next forward steers it; the token
just sampled was drawn before it and is kept."""

from __future__ import annotations

from typing import TYPE_CHECKING

from millm.engine.events import Delta, Event, Finish

if TYPE_CHECKING:
    from millm.engine.decode.rows import Row
    from millm.steering.target import RequestSteering, Watching


def react(watching: Watching, row: Row) -> tuple[list[Event], RequestSteering | None]:
    """The events of an ``abort`` (the row is closed), else the steering a fired ``steer`` asks for (None: none
    fired)."""
    steer = None
    for i in watching.firing(row.index):
        watch = watching.watches[i]
        if watch.action == "abort":
            piece = row.output.close("content_filter")
            return [*([Delta(row.index, piece)] if piece else []), Finish(row.index, "content_filter",
                                                                          row.output.tokens)], None
        steer = watch.steering
    return [], steer
