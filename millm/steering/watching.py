"""One request's probes while it decodes: every probe's score at every position read, per row and span (prompt,
response), written into a buffer allocated when the request starts. A read is one matmul per row and layer and
one copy into the buffer, never a Python loop over probes; an armed probe's firing is one lookup of the scores
just written (a rolling mean's: the mean of its last ``window``, ``rolling_means``); the aggregations (max,
mean, last, rolling_mean) and the first response position at each threshold are computed once, for the
verdicts, when the request ends."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from millm.steering.probe import PROMPT, RESPONSE, ROLLING, Watch

SPANS = {"prompt": (PROMPT,), "response": (RESPONSE,), "both": (PROMPT, RESPONSE)}


@dataclass
class Watching:
    """One request's probes and their scores for its ``rows`` rows (choice indices) of at most ``length``
    positions a span, on ``device``: the probes sorted by layer, each layer's a contiguous slice of the buffer's
    columns; ``written[layer][span][row]`` is how many positions that layer has scored there."""

    watches: Sequence[Watch]
    rows: int
    length: int
    device: torch.device
    dtype: torch.dtype
    layers: dict[int, tuple[slice, torch.Tensor, torch.Tensor]] = field(init=False)
    scores: torch.Tensor = field(init=False)  # [span, rows, length, probes] (fp32)
    written: dict[int, tuple[list[int], list[int]]] = field(init=False)
    armed: list[int] = field(init=False)  # the probes that act (abort, steer)
    acted: dict[tuple[int, int], int] = field(default_factory=dict)  # (row, probe) -> the position it acted at

    def __post_init__(self) -> None:
        self.watches = sorted(self.watches, key=lambda w: w.layer)
        self.layers, self.written = {}, {}
        for layer in dict.fromkeys(w.layer for w in self.watches):
            at = [i for i, w in enumerate(self.watches) if w.layer == layer]
            weight = torch.tensor([list(self.watches[i].weight) for i in at], dtype=self.dtype, device=self.device)
            bias = torch.tensor([self.watches[i].bias for i in at], device=self.device)
            self.layers[layer] = (slice(at[0], at[-1] + 1), weight.T.contiguous(), bias)
            self.written[layer] = ([0] * self.rows, [0] * self.rows)
        self.scores = torch.zeros(2, self.rows, self.length, len(self.watches), device=self.device)
        self.armed = [i for i, w in enumerate(self.watches) if w.acts]

    def reader(self, layer: int, row: int, span: int) -> Callable[[torch.Tensor], None]:
        """The reader of ``row``'s residual ``[1, T, d]`` at ``layer`` in ``span`` (PROMPT or RESPONSE)."""
        return lambda hidden: self.read(layer, row, span, hidden)

    def read(self, layer: int, row: int, span: int, hidden: torch.Tensor) -> None:
        """Score ``row``'s ``T`` new positions with every probe at ``layer`` into the buffer."""
        cols, weight, bias = self.layers[layer]
        written = self.written[layer][span]
        start, count = written[row], hidden.shape[1]
        self.scores[span, row, start:start + count, cols] = (hidden[0] @ weight).float() + bias
        written[row] = start + count

    def firing(self, row: int) -> list[int]:
        """The armed probes (abort, steer) of ``row`` whose score at the response position read last reached their
        threshold (a rolling mean's: the mean of the ``window`` scores ending there, once there are as many; the
        first such position, since each is checked after every step) and have not acted yet: each is recorded as
        acting now, at that position."""
        if not self.armed:
            return []
        at = [self.written[self.watches[i].layer][RESPONSE][row] - 1 for i in self.armed]
        live = [(i, p) for i, p in zip(self.armed, at)
                if p + 1 >= (self.watches[i].window or 1) and (row, i) not in self.acted]
        if not live:
            return []
        if all(self.watches[i].window is None for i, _ in live):
            values = self.scores[RESPONSE, row, [p for _, p in live], [i for i, _ in live]].tolist()
        else:
            values = torch.stack([self._last(row, i, p) for i, p in live]).tolist()
        now = [(i, p) for (i, p), v in zip(live, values) if v >= self.watches[i].threshold]
        for i, p in now:
            self.acted[(row, i)] = p
        return [i for i, _ in now]

    def _last(self, row: int, i: int, p: int) -> torch.Tensor:
        """Probe ``i``'s score of ``row`` at response position ``p`` (a rolling mean's window ending there)."""
        window = self.watches[i].window
        if window is None:
            return self.scores[RESPONSE, row, p, i]
        return rolling_means(self.scores[RESPONSE, row, p + 1 - window:p + 1, i], window)[0]

    def verdicts(self) -> list[dict[str, Any]]:
        """Each row's verdict of each probe: its score (the aggregation over its span; None where it read
        nothing, or a rolling mean fewer tokens than its window), threshold, whether it fired, the first response
        position at the threshold (a rolling mean's: where the first window at it ends; None when none was), and
        the action taken (where it acted, that is its position)."""
        scores = self.scores.cpu()
        out = []
        for row in range(self.rows):
            for i, w in enumerate(self.watches):
                written = self.written[w.layer]
                values = torch.cat([scores[s, row, :written[s][row], i] for s in SPANS[w.span]])
                response = scores[RESPONSE, row, :written[RESPONSE][row], i]
                if w.window is not None:  # a rolling mean runs over the response: each full window's mean
                    values = response = rolling_means(response, w.window)
                score = float(aggregate(values, w.aggregation)) if len(values) else None
                reached = (response >= w.threshold).nonzero()
                acted = (row, i) in self.acted
                position = int(reached[0]) + (w.window or 1) - 1 if len(reached) else None
                verdict = {"probe": w.name, "index": row, "layer": w.layer, "aggregation": w.aggregation,
                           "span": w.span, "score": None if score is None else round(score, 6),
                           "threshold": w.threshold, "fired": acted or (score is not None and score >= w.threshold),
                           "position": self.acted.get((row, i), position), "action": w.action, "acted": acted}
                out.append(verdict if w.window is None else {**verdict, "window": w.window})
        return out


def rolling_means(values: torch.Tensor, window: int) -> torch.Tensor:
    """The mean of each ``window`` consecutive ``values`` (``[n]`` -> ``[n - window + 1]``; empty when there are
    fewer than ``window``): entry ``k`` is the window ending at ``k + window - 1``."""
    if len(values) < window:
        return values[:0]
    return values.unfold(0, window, 1).mean(-1)


def aggregate(values: torch.Tensor, aggregation: str) -> torch.Tensor:
    """``values`` aggregated: their max, mean or last (a rolling mean's ``values`` are its windows' means, whose
    max it takes)."""
    if aggregation in ("max", ROLLING):
        return values.max()
    return values.mean() if aggregation == "mean" else values[-1]
