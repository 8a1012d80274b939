"""What steering is, whatever applies it: attached SAEs, their values, the rows that steer, and their deltas.

Each attached SAE has a preallocated delta buffer (``sum_i clamp(strength_i) * W_dec[i]``, the live
base) and a preallocated row buffer (``[rows, d_model]``): every generated row is bound to a row of
its own, carrying its request's own values (``RequestSteering``: a profile, a dial) or else the live base.
Values are changed by rewriting those buffers in place.

Operators change the *base* values. Rows that follow the base are rewritten at once; a row with values of its
own keeps them until it leaves, so an operator change made during such a request is never undone
(operator wins), and is reported not live until the request ends.

``SteeringCore`` holds these rules once. How the deltas reach a model is a subclass's: forward hooks on
HF decoder layers (``millm.steering.controller.Steering``), or llama.cpp's control vectors
(``millm.steering.cvec.ControlVectorSteering``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from millm.errors import InvalidFeatureIndex, InvalidParameter, SAENotAttached
from millm.sae.model import SAE
from millm.steering.scope import ALL, Scope, gates
from millm.steering.values import check_values, clamp

if TYPE_CHECKING:
    from millm.steering.sensors import ClusterSensor

Reader = Callable[[torch.Tensor], None]
Values = dict[str, dict[int, float]]  # strengths per SAE id, per feature index

LIVE = "live"
"""What steers a response that the live values (or a chat's own values over them) steer (X-miLLM-Steering)."""


@dataclass
class Attachment:
    """One SAE on one layer's output (resid_post)."""

    sae_id: str
    sae: SAE
    layer: int
    delta: torch.Tensor  # the live base delta (what rows following the live values copy)
    values: dict[int, float] = field(default_factory=dict)
    handle: Any = None
    unsteered_readers: list[Reader] = field(default_factory=list)  # called on suppressed passes (scoring)
    rows: torch.Tensor | None = None  # per-row deltas, [rows, d_model]
    gates: torch.Tensor | None = None  # per-row gates by phase, [2, rows] (millm.steering.scope)
    row_steering: set[int] = field(default_factory=set)  # rows whose delta here is non-zero
    sensors: dict[str, ClusterSensor] = field(default_factory=dict)  # sensing clusters on it, by name


@dataclass(frozen=True)
class RequestSteering:
    """What steers one request, decided before it is queued: the values its rows steer with, and what its
    response headers say about it. Every front end, the engine's plans and research carry this one type.

    ``values`` None: its rows follow the live values, as the operator leaves them; otherwise they are its own
    (a profile's, the live values at a dial, a chat's ``--steer``, a research case's; empty: pinned unsteered),
    under ``name`` (X-miLLM-Steering when they steer: a profile's name, or ``live``).
    """

    name: str = LIVE
    values: Values | None = None
    echo: str | None = None  # X-miLLM-Steering-Intensity
    rung: int | None = None  # X-miLLM-Circuit-Rung: a circuit steers this response natively
    scope: Scope | None = None  # the profile's steering_scope (None: it names none)
    pinned: Mapping[str, Attachment] = field(default_factory=dict, compare=False, repr=False)
    """The SAEs its own values steer through, as resolved (``check``)."""

    def check(self, steering: SteeringCore) -> None:
        """Between decode steps: stop a request whose steering an operator change made invalid.

        An SAE its values steer through that was detached, or replaced by another attachment, since the request
        was resolved makes its feature indices meaningless; the request ends with ``invalid_feature_index`` and
        the operator's change stands.
        """
        for sae_id, attachment in self.pinned.items():
            now = steering.attachments.get(sae_id)
            if now is not attachment:
                what = "detached" if now is None else "replaced"
                raise InvalidFeatureIndex(f"SAE {sae_id}, which this request's steering ('{self.name}') runs through, "
                                          f"was {what} while the request was generating; its feature indices no "
                                          "longer apply, so the request stopped.")


def own_values(steering: RequestSteering | None) -> Values | None:
    """The values a request's rows steer with of their own; None: they follow the live values."""
    return steering.values if steering is not None else None


def _own(steering: RequestSteering | None) -> tuple[str, Values] | None:
    """A request's name and its own values; None: its rows follow the live values."""
    if steering is None or steering.values is None:
        return None
    return steering.name, steering.values


class SteeringCore:
    """Attached SAEs and live steering values for one model of ``n_layers`` layers of width ``d_model``.

    Subclasses apply the deltas: ``_install``/``_uninstall`` put an attachment on the model and take it off,
    ``_check_attach`` refuses what they cannot apply, ``_layer_device`` says where a layer's buffers live.
    """

    def __init__(self, n_layers: int, d_model: int, device: torch.device, dtype: torch.dtype) -> None:
        self.n_layers = n_layers
        self.d_model = d_model
        self.device, self.dtype = device, dtype
        self.attachments: dict[str, Attachment] = {}
        self.enabled = True
        self.active_profile: str | None = None
        self._suppressed = False
        self._lock = threading.RLock()
        self._slots = 0  # rows reserved in each attachment's row buffer (0: none yet)
        self._row_sources: dict[int, tuple[str, Values] | None] = {}  # bound slot -> (name, own values); None: base
        self._row_scopes: dict[int, Scope] = {}  # bound slot -> where its steering applies
        self.row_errors: dict[int, Exception] = {}  # bound slot -> why its delta could not be rewritten

    # what a subclass decides
    def _install(self, att: Attachment) -> None:
        """Put ``att`` on the model (a forward hook); nothing by default."""

    def _uninstall(self, att: Attachment) -> None:
        """Take ``att`` off the model."""

    def _check_attach(self, sae_id: str, sae: SAE, layer: int) -> None:
        """Refuse an SAE or layer this way of steering cannot apply (every layer of the model, by default)."""
        if not 0 <= layer < self.n_layers:
            raise InvalidParameter(f"'layer' must be between 0 and {self.n_layers - 1}, got {layer}.", param="layer")

    def _layer_device(self, layer: int) -> torch.device:
        return self.device

    # attaching
    def attach(self, sae_id: str, sae: SAE, layer: int) -> Attachment:
        """Attach ``sae`` to ``layer``; one SAE per layer (a vector set beside it), d_in must match the model.

        All or nothing: re-attaching an id keeps its values, and a value the new SAE cannot hold (an index
        past a smaller SAE's width) is refused before anything changes; should rewriting the buffers fail
        after the attachment is swapped, the previous attachment is put back.
        """
        self._check_attach(sae_id, sae, layer)
        if sae.d_in != self.d_model:
            raise InvalidParameter(f"SAE {sae_id} has d_in {sae.d_in}, but the model's residual width is "
                                   f"{self.d_model}.", param="sae")
        with self._lock:
            for other in self.attachments.values():  # a vector set shares its layer: the deltas add
                if other.layer == layer and other.sae_id != sae_id and "linear" not in (
                        other.sae.architecture, sae.architecture):
                    raise InvalidParameter(f"Layer {layer} already has SAE {other.sae_id} attached; detach it first.",
                                           param="layer")
            old = self.attachments.get(sae_id)
            values = dict(old.values) if old is not None else {}
            past = sorted(f for f in values if not 0 <= f < sae.d_sae)
            if past:
                raise InvalidFeatureIndex(f"SAE {sae_id} is steering feature(s) {', '.join(map(str, past))}, outside "
                                          f"the new SAE's 0-{sae.d_sae - 1}; clear them before re-attaching it.",
                                          param="sae")
            # an ordinary tensor even when attached by a command between decode steps (inside inference
            # mode): the buffer is rewritten in place later, also outside inference mode
            device = self._layer_device(layer)  # a model split across cards: the card holding this layer
            with torch.inference_mode(False):
                delta = torch.zeros(self.d_model, device=device, dtype=self.dtype)
            att = Attachment(sae_id, sae.to(device, self.dtype), layer, delta, values=values)
            if self._slots:
                att.rows, att.gates = self._row_buffer(device), self._gate_buffer(device)

            def swap(new: Attachment | None, gone: Attachment | None) -> None:
                if gone is not None:
                    self._uninstall(gone)
                    del self.attachments[gone.sae_id]
                if new is not None:
                    self._install(new)
                    self.attachments[new.sae_id] = new

            swap(att, old)
            try:
                self._refresh()
            except BaseException:
                swap(old, att)
                self._refresh()
                raise
            return att

    def detach(self, sae_id: str) -> Attachment:
        with self._lock:
            att = self._attachment(sae_id)
            self._uninstall(att)
            del self.attachments[sae_id]
            self._detached(att)
            return att

    def _detached(self, att: Attachment) -> None:
        """``att`` no longer steers anything (a subclass that copies deltas elsewhere forgets them)."""

    def detach_all(self) -> None:
        """Take every attachment off (the model is being unloaded): nothing stale is ever left behind."""
        with self._lock:
            for att in list(self.attachments.values()):
                self._uninstall(att)
                self._detached(att)
            self.attachments.clear()

    def _attachment(self, sae_id: str) -> Attachment:
        if sae_id not in self.attachments:
            raise SAENotAttached(f"SAE {sae_id} is not attached to the loaded model.", param="sae")
        return self.attachments[sae_id]

    def resolve_sae(self, ref: Any) -> Attachment:
        """An attached SAE named by id, or by the layer it is attached to."""
        if isinstance(ref, int) and not isinstance(ref, bool):
            for att in self.attachments.values():
                if att.layer == ref:
                    return att
            raise SAENotAttached(f"No SAE is attached to layer {ref}.", param="sae")
        return self._attachment(str(ref))

    # operator changes (the base)
    @contextmanager
    def _changing(self) -> Iterator[None]:
        """An operator change to the base: it stands with every buffer rewritten, or (when a delta cannot
        be computed from it) the base is put back as it was and no buffer has changed."""
        with self._lock:
            values = {att.sae_id: att.values for att in self.attachments.values()}
            profile, enabled = self.active_profile, self.enabled
            try:
                yield
                self._refresh()
            except BaseException:
                for att in self.attachments.values():
                    att.values = values.get(att.sae_id, att.values)
                self.active_profile, self.enabled = profile, enabled
                raise

    def set_values(self, sae_id: str, values: Any, *, merge: bool) -> None:
        """Replace (or merge into) one SAE's values; in a merge a strength of 0 removes the feature."""
        with self._changing():
            att = self._attachment(sae_id)
            checked = check_values(values, att.sae.d_sae)
            new = {**att.values, **checked} if merge else checked
            att.values = {f: s for f, s in new.items() if s != 0.0}
            self.active_profile = None

    def clear(self) -> None:
        with self._changing():
            for att in self.attachments.values():
                att.values = {}
            self.active_profile = None

    def set_enabled(self, enabled: bool) -> None:
        with self._changing():
            self.enabled = enabled

    def activate(self, name: str, values: dict[str, dict[int, float]]) -> None:
        """Make a profile's (already resolved) values the live base values."""
        with self._changing():
            for att in self.attachments.values():
                att.values = dict(values.get(att.sae_id, {}))
            self.active_profile = name

    # rows
    def _row_buffer(self, device: torch.device) -> torch.Tensor:
        with torch.inference_mode(False):
            return torch.zeros(self._slots, self.d_model, device=device, dtype=self.dtype)

    def _gate_buffer(self, device: torch.device) -> torch.Tensor:
        with torch.inference_mode(False):
            return torch.ones(2, self._slots, device=device, dtype=self.dtype)

    def reserve_rows(self, slots: int) -> None:
        """Give every attachment (now and later) at least ``slots`` delta rows; rows already bound keep
        their deltas and gates (the buffers only grow, rarely: a request served alone bigger than any before)."""
        with self._lock:
            if slots <= self._slots:
                return
            old, self._slots = self._slots, slots
            for att in self.attachments.values():
                rows, row_gates = self._row_buffer(att.delta.device), self._gate_buffer(att.delta.device)
                if att.rows is not None and att.gates is not None:
                    rows[:old].copy_(att.rows)
                    row_gates[:, :old].copy_(att.gates)
                att.rows, att.gates = rows, row_gates

    def bind_row(self, slot: int, steering: RequestSteering | None, scope: Scope = ALL) -> None:
        """Slot ``slot`` now steers with ``steering``'s own values (None, or its values None: the live base,
        following operator changes), at the positions ``scope`` names.

        Its deltas are computed first: values that cannot steer (a feature index the SAE lacks) raise with
        nothing recorded, so the slot stays unbound."""
        own = _own(steering)
        with self._lock:
            deltas = [(att, self._delta(att, self._row_values(att, own)))
                      for att in self.attachments.values() if att.rows is not None]
            self._row_sources[slot] = own
            self._row_scopes[slot] = scope
            self.row_errors.pop(slot, None)
            for att, delta in deltas:
                self._write_row(att, slot, delta)
                self._write_gates(att, slot, scope)

    def release_row(self, slot: int) -> None:
        with self._lock:
            self._row_sources.pop(slot, None)
            self._row_scopes.pop(slot, None)
            self.row_errors.pop(slot, None)
            for att in self.attachments.values():
                if att.rows is not None:
                    self._write_row(att, slot, None)
                    self._write_gates(att, slot, ALL)

    def row_scope(self, slot: int) -> Scope:
        """Where the row bound to ``slot`` is steered (``all`` for a slot not bound)."""
        with self._lock:
            return self._row_scopes.get(slot, ALL)

    @staticmethod
    def _write_gates(att: Attachment, slot: int, scope: Scope) -> None:
        if att.gates is not None:
            att.gates[:, slot] = torch.tensor(gates(scope), dtype=att.gates.dtype)

    @property
    def live(self) -> bool:
        """Whether the base values are what the model runs with now: False while a request that carries
        its own steering (a profile, a dial) is generating; the base becomes the whole story when it ends."""
        with self._lock:  # read on the event loop while the engine thread binds and releases rows
            return all(source is None for source in self._row_sources.values())

    @contextmanager
    def suppressed(self) -> Iterator[None]:
        """No SAE steers or reads during this block (embeddings, scoring)."""
        previous, self._suppressed = self._suppressed, True
        try:
            yield
        finally:
            self._suppressed = previous

    def label(self, steering: RequestSteering | None = None) -> str:
        """What steers a response: ``none``, ``live`` or a profile's name (for X-miLLM-Steering)."""
        own = _own(steering)
        if own is not None:
            return own[0] if any(own[1].values()) and self.attachments else "none"
        if not self.enabled or not any(att.values for att in self.attachments.values()):
            return "none"
        return self.active_profile or LIVE

    # the buffers
    def _delta(self, att: Attachment, values: dict[int, float]) -> torch.Tensor | None:
        """``sum_i clamp(strength_i) * W_dec[i]`` (None: nothing steers); raises for an index the SAE lacks."""
        if not values:
            return None
        index = torch.tensor(list(values), device=att.delta.device)
        strengths = torch.tensor([clamp(s) for s in values.values()], device=att.delta.device, dtype=self.dtype)
        return strengths @ att.sae.W_dec[index]

    @staticmethod
    def _write(out: torch.Tensor, delta: torch.Tensor | None) -> bool:
        """Copy ``delta`` into the buffer ``out`` in place (zeros for None); whether it steers at all."""
        if delta is None:
            out.zero_()
            return False
        out.copy_(delta)
        return True

    def _base_values(self, att: Attachment) -> dict[int, float]:
        return att.values if self.enabled else {}

    def _row_values(self, att: Attachment, own: tuple[str, Values] | None) -> dict[int, float]:
        return own[1].get(att.sae_id, {}) if own is not None else self._base_values(att)

    def _write_row(self, att: Attachment, slot: int, delta: torch.Tensor | None) -> None:
        assert att.rows is not None
        if self._write(att.rows[slot], delta):
            att.row_steering.add(slot)
        else:
            att.row_steering.discard(slot)

    def _refresh(self) -> None:
        """Rewrite every delta buffer in place from the base, and every bound row from its source.

        Every delta is computed before any buffer is written, so a change whose own delta cannot be
        computed raises with the buffers untouched. A bound row whose own values no longer fit an
        attachment (an SAE replaced under it) does not hold the change back: it steers nothing and its
        error waits in ``row_errors`` for its request to end alone.

        The buffer is the direction in the SAE's output space; for an SAE that normalises per position
        (SAELens constant_norm_rescale, layer_norm) the hook scales it by each position's factor.
        """
        attachments = list(self.attachments.values())
        live = {att.sae_id: self._delta(att, self._base_values(att)) for att in attachments}
        bound = [att for att in attachments if att.rows is not None]
        rows: dict[int, list[tuple[Attachment, torch.Tensor | None]]] = {}
        errors: dict[int, Exception] = {}
        for slot, source in self._row_sources.items():
            if source is None:
                rows[slot] = [(att, live[att.sae_id]) for att in bound]
                continue
            name, own = source
            try:
                rows[slot] = [(att, self._delta(att, own.get(att.sae_id, {}))) for att in bound]
            except Exception as exc:  # this row's own steering is broken: it alone stops
                rows[slot] = [(att, None) for att in bound]
                errors[slot] = InvalidFeatureIndex(f"This request's steering ('{name}') no longer fits the "
                                                   f"attached SAEs ({exc}); the request stopped.")
        for att in attachments:
            self._write(att.delta, live[att.sae_id])
        for slot, deltas in rows.items():
            for att, delta in deltas:
                self._write_row(att, slot, delta)
                self._write_gates(att, slot, self._row_scopes.get(slot, ALL))
        self.row_errors.update(errors)

    def snapshot(self) -> dict[str, Any]:
        """The GET /api/steering body (base values, as an operator set them)."""
        return {"enabled": self.enabled, "active_profile": self.active_profile,
                "saes": {a.sae_id: {"layer": a.layer, "values": {str(f): s for f, s in sorted(a.values.items())}}
                         for a in self.attachments.values()}}
