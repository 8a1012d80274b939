"""One request's probes while it decodes: per row and probe the running max, sum, positions read and last score of
each span (prompt, response) in preallocated tensors, updated by one matmul per row and layer as positions are
read (the readers the steering hooks call), never a Python loop over probes; the first response position at each
probe's threshold, for its verdict and its action."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from millm.steering.probe import RESPONSE, Watch

_NEG = float("-inf")


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
            weight = torch.tensor([list(self.watches[i].weight) for i in at], dtype=self.dtype, device=self.device)
            weight = weight.T.contiguous()
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
            count = torch.stack([s.count[:, i] for s in parts]).sum(0)
            if w.aggregation == "max":
                value = torch.stack([s.high[:, i] for s in parts]).max(0).values
            elif w.aggregation == "mean":
                value = torch.stack([s.total[:, i] for s in parts]).sum(0) / count.clamp_min(1)
            else:  # last: the response's last read when it read any, else the prompt's
                value = parts[-1].last[:, i] if len(parts) == 1 else torch.where(
                    response.count[:, i] > 0, response.last[:, i], prompt.last[:, i])
            out[:, i] = torch.where(count > 0, value, torch.full_like(value, float("nan")))
        return out.cpu()
