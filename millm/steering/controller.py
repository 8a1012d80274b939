"""Live steering of one loaded HF model: the forward hooks that apply the attached SAEs' deltas.

What steering is (attachments, values, requests' own values, rows, deltas, labels, operator wins) lives in
``millm.steering.core.SteeringCore``; this class hooks each attachment onto its decoder layer's output.
Every forward of the scheduler adds each row's own delta (``rows``: a ``RowView``); nothing else is steered.
Values are changed by rewriting buffers in place, so a captured decode graph would read the new values
without being rebuilt.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from millm.sae.activations import decoder_layers
from millm.steering.core import Attachment, Reader, RequestSteering, SteeringCore
from millm.steering.probe import reader_key

__all__ = ["Attachment", "Reader", "RequestSteering", "RowView", "Steering"]


@dataclass(frozen=True)
class RowView:
    """One forward of the scheduler: the steering rows it covers, in order, and per SAE the rows whose
    residual is read (``(row offset in the forward, reader)``) before its delta (``readers``: monitoring,
    a pre_steering read-out) and after it (``post``: a post_steering read-out). ``phase`` says whether the
    forward feeds prompt or generated positions (``millm.steering.scope``): each row's delta is gated by its
    scope for that phase; None (a research forward) applies every delta as it is."""

    first: int
    count: int
    readers: dict[str, list[tuple[int, Reader]]] = field(default_factory=dict)
    post: dict[str, list[tuple[int, Reader]]] = field(default_factory=dict)
    phase: int | None = None


class Steering(SteeringCore):
    """Attached SAEs and live steering values for one HF model, applied by forward hooks."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.layers = decoder_layers(model)
        param = next(model.parameters())
        super().__init__(len(self.layers), int(model.config.hidden_size), param.device, param.dtype)
        self._view: RowView | None = None
        self._watched: dict[int, tuple[int, Any]] = {}  # layer -> (probes' requests reading it, its hook)

    def _install(self, att: Attachment) -> None:
        att.handle = self.layers[att.layer].register_forward_hook(self._hook(att))

    def _uninstall(self, att: Attachment) -> None:
        att.handle.remove()

    def watch_layer(self, layer: int) -> None:
        """Call the readers a forward's view holds under ``reader_key(layer)`` (probes) with ``layer``'s output,
        until as many ``unwatch_layer`` calls: one hook per layer however many requests read it, installed
        first so it reads before any steering delta of that layer (where monitoring reads)."""
        count, handle = self._watched.get(layer, (0, None))
        if handle is None:
            handle = self.layers[layer].register_forward_hook(self._probe_hook(reader_key(layer)), prepend=True)
        self._watched[layer] = (count + 1, handle)

    def unwatch_layer(self, layer: int) -> None:
        count, handle = self._watched.pop(layer)
        if count > 1:
            self._watched[layer] = (count - 1, handle)
        else:
            handle.remove()

    def _probe_hook(self, key: str) -> Callable[..., Any]:
        """A scheduler forward's probe readers of one layer, each reading its row's positions; nothing else."""
        def hook(module: Any, args: Any, output: Any) -> None:
            view = self._view
            if view is None or self._suppressed:
                return
            hidden = output[0] if isinstance(output, tuple) else output
            for offset, read in view.readers.get(key, ()):
                read(hidden[offset:offset + 1])
        return hook

    def _layer_device(self, layer: int) -> torch.device:
        param = next(self.layers[layer].parameters(), None)
        return param.device if param is not None else self.device

    @contextmanager
    def rows(self, view: RowView) -> Iterator[None]:
        """The hooks steer this forward per row (each slot's own delta) and call only ``view``'s readers."""
        previous, self._view = self._view, view
        try:
            yield
        finally:
            self._view = previous

    @contextmanager
    def each_row(self, steerings: Sequence[RequestSteering]) -> Iterator[None]:
        """Forwards in this block are batches of ``len(steerings)`` rows, row ``i`` steered by ``steerings[i]``'s
        own values alone (no live value steers them): a sweep's many strengths and features in one batch.

        The rows take slots past every slot a request holds (a command runs between the scheduler's steps,
        with its requests' rows still bound) and are released afterwards; values that cannot steer raise
        with every slot released."""
        first = 1 + max(self._row_sources, default=-1)
        self.reserve_rows(first + len(steerings))
        try:
            for i, steering in enumerate(steerings):
                self.bind_row(first + i, steering)
            with self.rows(RowView(first, len(steerings))):
                yield
        finally:
            for i in range(len(steerings)):
                self.release_row(first + i)

    @contextmanager
    def reading_unsteered(self, sae_id: str, reader: Reader) -> Iterator[None]:
        """Call ``reader(residual)`` at ``sae_id``'s layer on the suppressed passes of this block (a scoring
        read-out), where no SAE steers."""
        att = self._attachment(sae_id)
        att.unsteered_readers.append(reader)
        try:
            yield
        finally:
            att.unsteered_readers.remove(reader)

    def _hook(self, att: Attachment) -> Callable[..., Any]:
        """The one way a delta reaches the residual: each row of a scheduler forward gets its own slot's delta
        (``_row_hook``). A suppressed pass (scoring, embeddings) and a forward outside the scheduler are not
        steered."""
        def hook(module: Any, args: Any, output: Any) -> Any:
            if self._suppressed:
                for read in att.unsteered_readers:
                    read(output[0] if isinstance(output, tuple) else output)
                return None
            view = self._view
            return None if view is None else self._row_hook(att, view, output)
        return hook

    def _row_hook(self, att: Attachment, view: RowView, output: Any) -> Any:
        """A scheduler forward: each row gets its own slot's delta; only the view's readers read."""
        hidden = output[0] if isinstance(output, tuple) else output
        for offset, read in view.readers.get(att.sae_id, ()):
            read(hidden[offset:offset + 1])
        slots = range(view.first, view.first + view.count)
        steered = att.rows is not None and any(slot in att.row_steering for slot in slots)
        if steered:
            assert att.rows is not None
            delta = att.rows[view.first:view.first + view.count].unsqueeze(1)
            if view.phase is not None and att.gates is not None:
                delta = delta * att.gates[view.phase, view.first:view.first + view.count, None, None]
            if att.sae.per_position:
                delta = delta * att.sae.output_scale(hidden)
            hidden = hidden + delta
        for offset, read in view.post.get(att.sae_id, ()):
            read(hidden[offset:offset + 1])
        if not steered:
            return None
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden
