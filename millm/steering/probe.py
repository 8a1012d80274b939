"""What a served probe is: its aggregations, spans and actions, the rules that check them, and the ``Watch`` the
engine serves (``millm.steering.watching`` scores it while decoding). Imports no torch.

A probe is a linear read-out at one layer's output, ``score = w . h + b`` at each position it reads, aggregated
over positions (``max``, ``mean`` or ``last``, over the prompt, the response or both, or ``rolling_mean``: the
highest mean of ``window`` consecutive response scores) and compared with a threshold (its operating point). The
engine sees a probe as a ``Watch``: the read-out, the threshold and what to do when it fires.

Only ``max`` and ``rolling_mean`` over the response can be decided as tokens arrive (their verdict never changes
once it fired), so only they may carry an action: ``abort`` (the row ends at the firing step) or ``steer`` (a
profile steers the row from the next step). A rolling mean needs a full window: it cannot fire before the
response's ``window``-th token, and an answer shorter than its window has no score."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from millm.errors import InvalidParameter

if TYPE_CHECKING:
    from millm.steering.core import RequestSteering

AGGREGATIONS = ("max", "mean", "last", "rolling_mean")
SPANS = ("prompt", "response", "both")
ACTIONS = ("flag", "abort", "steer")
ROLLING = "rolling_mean"  # the aggregation that takes a window, over the response only
STREAMABLE = (("max", "response"), (ROLLING, "response"))  # decided as tokens arrive: the only ones that may act
WINDOW = (1, 1024, 8)  # a rolling mean's window in response tokens: low, high, default
PROMPT, RESPONSE = 0, 1  # the spans a read falls in (its row prefilling, or decoding)


def reader_key(layer: int) -> str:
    """Where a forward's view holds the probe readers of ``layer`` (beside the SAE ids its readers are keyed by)."""
    return f"layer:{layer}"


def check_aggregation(aggregation: Any, span: Any, window: Any = None) -> tuple[str, str, int | None]:
    """A known aggregation and span, and the window a ``rolling_mean`` takes (default ``WINDOW[2]``; no other
    aggregation takes one), or a 400 naming the field."""
    if aggregation not in AGGREGATIONS:
        raise InvalidParameter(f"'aggregation' must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}.",
                               param="aggregation")
    if span not in SPANS:
        raise InvalidParameter(f"'span' must be one of {', '.join(SPANS)}, got {span!r}.", param="span")
    if aggregation != ROLLING:
        if window is not None:
            raise InvalidParameter(f"'window' is a {ROLLING}'s only; this probe aggregates {aggregation!r}.",
                                   param="window")
        return aggregation, span, None
    if span != "response":
        raise InvalidParameter(f"A {ROLLING} runs over the 'response' only, got span {span!r}.", param="span")
    if window is None:
        return aggregation, span, WINDOW[2]
    low, high = WINDOW[0], WINDOW[1]
    if isinstance(window, bool) or not isinstance(window, int) or not low <= window <= high:
        raise InvalidParameter(f"'window' must be an integer from {low} to {high} (response tokens), got "
                               f"{window!r}.", param="window")
    return aggregation, span, window


def check_action(action: Any, profile: Any, aggregation: str, span: str, param: str = "action") -> str:
    """A known action that this aggregation can take (``abort`` and ``steer`` need one decided as tokens arrive;
    ``steer`` needs a profile, the others none), or a 400 naming the field (``param``)."""
    if action not in ACTIONS:
        raise InvalidParameter(f"'{param}' must be one of {', '.join(ACTIONS)}, got {action!r}.", param=param)
    if action != "flag" and (aggregation, span) not in STREAMABLE:
        raise InvalidParameter(f"'{param}' {action!r} acts while decoding, which only a probe aggregating 'max' or "
                               f"'{ROLLING}' over the 'response' can (this one takes the {aggregation} over the "
                               f"{span}).", param=param)
    if (action == "steer") != isinstance(profile, str):
        raise InvalidParameter(f"'{param}' 'steer' takes a 'profile' (a saved profile's name), and only it does.",
                               param="profile")
    return str(action)


@dataclass(frozen=True)
class Watch:
    """One probe as a request serves it: its read-out at ``layer`` (``weight``, d numbers, and ``bias``),
    aggregation, span and threshold (``window``: a rolling mean's, in response tokens; None for the others), and
    what it does when it fires (``steering`` for ``steer``, resolved from its profile)."""

    name: str
    layer: int
    weight: Sequence[float]
    bias: float
    aggregation: str
    span: str
    threshold: float
    action: str = "flag"
    profile: str | None = None
    steering: RequestSteering | None = None
    window: int | None = None

    @property
    def acts(self) -> bool:
        return self.action != "flag"
