"""One request's probes while it decodes: every probe's score at every position read, per row and span (prompt,
response), written into a buffer allocated when the request starts. A read is one matmul per row and layer and
one copy into the buffer, never a Python loop over probes; an armed probe's firing is one lookup of the scores
just written; the aggregations (max, mean, last) and the first response position at each threshold are
computed once, for the verdicts, when the request ends."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from millm.steering.probe import PROMPT, RESPONSE, Watch

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
        threshold (the first such position, since each is checked after every step) and have not acted yet: each
        is recorded as acting now, at that position."""
        if not self.armed:
            return []
        at = [self.written[self.watches[i].layer][RESPONSE][row] - 1 for i in self.armed]
        live = [(i, p) for i, p in zip(self.armed, at) if p >= 0 and (row, i) not in self.acted]
        if not live:
            return []
        probes = [i for i, _ in live]
        values = self.scores[RESPONSE, row, [p for _, p in live], probes].tolist()
        now = [(i, p) for (i, p), v in zip(live, values) if v >= self.watches[i].threshold]
        for i, p in now:
            self.acted[(row, i)] = p
        return [i for i, _ in now]

    def verdicts(self) -> list[dict[str, Any]]:
        """Each row's verdict of each probe: its score (the aggregation over its span; None where it read
        nothing), threshold, whether it fired, the first response position at the threshold (None when none
        was), and the action taken."""
        scores = self.scores.cpu()
        out = []
        for row in range(self.rows):
            for i, w in enumerate(self.watches):
                written = self.written[w.layer]
                parts = [scores[s, row, :written[s][row], i] for s in SPANS[w.span]]
                values = torch.cat(parts)
                score = float(_aggregate(values, w.aggregation)) if len(values) else None
                reached = (scores[RESPONSE, row, :written[RESPONSE][row], i] >= w.threshold).nonzero()
                acted = (row, i) in self.acted
                out.append({"probe": w.name, "index": row, "layer": w.layer, "aggregation": w.aggregation,
                            "span": w.span, "score": None if score is None else round(score, 6),
                            "threshold": w.threshold, "fired": acted or (score is not None and score >= w.threshold),
                            "position": int(reached[0]) if len(reached) else None, "action": w.action,
                            "acted": acted})
        return out


def _aggregate(values: torch.Tensor, aggregation: str) -> torch.Tensor:
    if aggregation == "max":
        return values.max()
    return values.mean() if aggregation == "mean" else values[-1]
