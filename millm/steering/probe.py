"""What a served probe is, and the per-request state that scores it while decoding.

A probe is a linear read-out at one layer's output, ``score = w . h + b`` at each position it reads, aggregated
over positions (``max``, ``mean`` or ``last``, over the prompt, the response or both) and compared with a
threshold (its operating point). The engine sees a probe as a ``Watch``: the read-out, the threshold and what to
do when it fires. A ``Watching`` holds one request's state: per row and probe the running max, sum, count and
last score of each span in preallocated tensors, updated by one matmul per row and layer as positions are read
(the readers the steering hooks call), never a Python loop over probes.

Only ``max`` over the response can be decided as tokens arrive (its verdict never changes once it fired), so
only it may carry an action: ``abort`` (the row ends at the firing step) or ``steer`` (a profile steers the row
from the next step)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from millm.errors import InvalidParameter
from millm.steering.core import RequestSteering

AGGREGATIONS = ("max", "mean", "last")
SPANS = ("prompt", "response", "both")
ACTIONS = ("flag", "abort", "steer")
STREAMABLE = (("max", "response"),)  # aggregations decided as tokens arrive: the only ones that may act
PROMPT, RESPONSE = 0, 1  # the spans a read falls in (its row prefilling, or decoding)
_NEG = float("-inf")


def reader_key(layer: int) -> str:
    """Where a forward's view holds the probe readers of ``layer`` (beside the SAE ids its readers are keyed by)."""
    return f"layer:{layer}"


def check_aggregation(aggregation: Any, span: Any) -> tuple[str, str]:
    """A known aggregation and span, or a 400 naming the field."""
    if aggregation not in AGGREGATIONS:
        raise InvalidParameter(f"'aggregation' must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}.",
                               param="aggregation")
    if span not in SPANS:
        raise InvalidParameter(f"'span' must be one of {', '.join(SPANS)}, got {span!r}.", param="span")
    return aggregation, span


def check_action(action: Any, profile: Any, aggregation: str, span: str, param: str = "action") -> str:
    """A known action that this aggregation can take (``abort`` and ``steer`` need one decided as tokens arrive;
    ``steer`` needs a profile, the others none), or a 400 naming the field (``param``)."""
    if action not in ACTIONS:
        raise InvalidParameter(f"'{param}' must be one of {', '.join(ACTIONS)}, got {action!r}.", param=param)
    if action != "flag" and (aggregation, span) not in STREAMABLE:
        raise InvalidParameter(f"'{param}' {action!r} acts while decoding, which only a probe aggregating 'max' over "
                               f"the 'response' can (this one takes the {aggregation} over the {span}).", param=param)
    if (action == "steer") != isinstance(profile, str):
        raise InvalidParameter(f"'{param}' 'steer' takes a 'profile' (a saved profile's name), and only it does.",
                               param="profile")
    return str(action)


@dataclass(frozen=True)
class Watch:
    """One probe as a request serves it: its read-out at ``layer`` (``weight`` ``[d]``, ``bias``), aggregation,
    span and threshold, and what it does when it fires (``steering`` for ``steer``, resolved from its profile)."""

    name: str
    layer: int
    weight: torch.Tensor
    bias: float
    aggregation: str
    span: str
    threshold: float
    action: str = "flag"
    profile: str | None = None
    steering: RequestSteering | None = None

    @property
    def acts(self) -> bool:
        return self.action != "flag"


@dataclass
class _Stats:
    """Per row and probe, one span's running max, sum, positions read and last score."""

    high: torch.Tensor
    total: torch.Tensor
    count: torch.Tensor
    last: torch.Tensor

    @classmethod
    def empty(cls, rows: int, probes: int, device: torch.device) -> _Stats:
        return cls(torch.full((rows, probes), _NEG, device=device), torch.zeros(rows, probes, device=device),
                   torch.zeros(rows, probes, device=device), torch.zeros(rows, probes, device=device))


@dataclass
class Watching:
    """One request's probes and their state for its ``rows`` rows (choice indices), on ``device``: the probes
    sorted by layer, each layer's a contiguous slice of the state's columns."""

    watches: Sequence[Watch]
    rows: int
    device: torch.device
    dtype: torch.dtype
    layers: dict[int, tuple[slice, torch.Tensor, torch.Tensor]] = field(init=False)
    stats: tuple[_Stats, _Stats] = field(init=False)
    fired_at: torch.Tensor = field(init=False)  # [rows, probes]: the first response position at the threshold
    thresholds: torch.Tensor = field(init=False)
    armed: list[int] = field(init=False)  # the probes that act (abort, steer)
    acted: dict[tuple[int, int], int] = field(default_factory=dict)  # (row, probe) -> the position it acted at

    def __post_init__(self) -> None:
        self.watches = sorted(self.watches, key=lambda w: w.layer)
        self.layers = {}
        for layer in dict.fromkeys(w.layer for w in self.watches):
            at = [i for i, w in enumerate(self.watches) if w.layer == layer]
            weight = torch.stack([self.watches[i].weight for i in at]).to(self.device, self.dtype).T.contiguous()
            bias = torch.tensor([self.watches[i].bias for i in at], device=self.device)
            self.layers[layer] = (slice(at[0], at[-1] + 1), weight, bias)
        count = len(self.watches)
        self.stats = (_Stats.empty(self.rows, count, self.device), _Stats.empty(self.rows, count, self.device))
        self.fired_at = torch.full((self.rows, count), -1, dtype=torch.long, device=self.device)
        self.thresholds = torch.tensor([w.threshold for w in self.watches], device=self.device)
        self.armed = [i for i, w in enumerate(self.watches) if w.acts]

    def reader(self, layer: int, row: int, span: int) -> Callable[[torch.Tensor], None]:
        """The reader of ``row``'s residual ``[1, T, d]`` at ``layer`` in ``span`` (PROMPT or RESPONSE)."""
        return lambda hidden: self.read(layer, row, span, hidden)

    def read(self, layer: int, row: int, span: int, hidden: torch.Tensor) -> None:
        """Score ``row``'s ``T`` new positions with every probe at ``layer`` and fold them into its state."""
        cols, weight, bias = self.layers[layer]
        scores = (hidden[0] @ weight).float() + bias  # [T, probes at this layer]
        stats = self.stats[span]
        if span == RESPONSE:
            crossed = (scores >= self.thresholds[cols]).any(0) & (self.fired_at[row, cols] < 0)
            first = (scores >= self.thresholds[cols]).float().argmax(0) + stats.count[row, cols].long()
            self.fired_at[row, cols] = torch.where(crossed, first, self.fired_at[row, cols])
        stats.high[row, cols] = torch.maximum(stats.high[row, cols], scores.max(0).values)
        stats.total[row, cols] += scores.sum(0)
        stats.last[row, cols] = scores[-1]
        stats.count[row, cols] += scores.shape[0]

    def firing(self, row: int) -> list[int]:
        """The armed probes (abort, steer) of ``row`` that reached their threshold and have not acted yet: each is
        recorded as acting now (at the response position it fired at)."""
        if not self.armed:
            return []
        fired = self.fired_at[row, self.armed].tolist()
        now = [i for i, at in zip(self.armed, fired) if at >= 0 and (row, i) not in self.acted]
        for i in now:
            self.acted[(row, i)] = int(fired[self.armed.index(i)])
        return now

    def verdicts(self) -> list[dict[str, Any]]:
        """Each row's verdict of each probe: its score (the aggregation over its span), threshold, whether it
        fired, the first response position at the threshold (None when none was), and the action taken."""
        scores = self._scores().tolist()
        fired_at = self.fired_at.tolist()
        out = []
        for row in range(self.rows):
            for i, w in enumerate(self.watches):
                score = scores[row][i]
                acted = (row, i) in self.acted
                out.append({"probe": w.name, "index": row, "layer": w.layer, "aggregation": w.aggregation,
                            "span": w.span, "score": None if score != score else round(score, 6),
                            "threshold": w.threshold, "fired": acted or (score == score and score >= w.threshold),
                            "position": fired_at[row][i] if fired_at[row][i] >= 0 else None,
                            "action": w.action, "acted": acted})
        return out

    def _scores(self) -> torch.Tensor:
        """``[rows, probes]``: each probe's aggregation over its span (NaN where its span read nothing)."""
        prompt, response = self.stats
        spans = {"prompt": (prompt,), "response": (response,), "both": (prompt, response)}
        out = torch.full((self.rows, len(self.watches)), float("nan"), device=self.device)
        for i, w in enumerate(self.watches):
            parts = spans[w.span]
            count = sum(s.count[:, i] for s in parts)
            if w.aggregation == "max":
                value = torch.stack([s.high[:, i] for s in parts]).max(0).values
            elif w.aggregation == "mean":
                value = sum(s.total[:, i] for s in parts) / count.clamp_min(1)
            else:  # last: the response's last read when it read any, else the prompt's
                value = parts[-1].last[:, i] if len(parts) == 1 else torch.where(
                    response.count[:, i] > 0, response.last[:, i], prompt.last[:, i])
            out[:, i] = torch.where(count > 0, value, torch.full_like(value, float("nan")))
        return out.cpu()
