"""Steering bases: what a profile, cluster, circuit or the live values steer with, as the dial takes them.

A request's steering (its ``profile`` and ``steering_intensity``) and a profile's activation both start
here: the named (or active) profile is looked up in the store, the cluster or circuit behind it is
found, a circuit's serving mode is decided against the attached SAEs, and the intensity resolver
(``millm.steering.intensity``) turns that base and the dial into strengths. Reads the store and the
hook controller; changes neither.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import NamedTuple

from millm.errors import ProfileNotFound
from millm.names import STORED
from millm.steering.core import LIVE, Attachment, RequestSteering, Values
from millm.steering.documents import Registered, Serving, ServingMode, parse_shape, stored_serving_mode
from millm.steering.imports import stored_cluster
from millm.steering.intensity import Base, BaseKind, Context, Dial, IntensitySettings, Strengths, Symbol, resolve
from millm.steering.profiles import ProfileDoc, resolve_entries
from millm.steering.scope import Scope
from millm.steering.target import SteeringTarget
from millm.store import Store


def profile_row(store: Store, name: str) -> dict[str, object]:
    """A saved profile (plain, or backed by a cluster or circuit); 404 when there is none."""
    found = store.profile(name)
    if found is None:
        raise ProfileNotFound(f"No profile is named '{name}'.", param="profile")
    return found


def stored_profile(store: Store, name: str) -> ProfileDoc:
    """A saved profile as a document; 404 when there is none."""
    row = profile_row(store, name)
    return ProfileDoc.model_validate({k: row[k] for k in ("name", "description", "model", "entries",
                                                          "steering_scope")}, context=STORED)


def registered(store: Store, attached: Mapping[str, int], widths: Mapping[str, int] | None = None) -> Registered:
    """What documents are checked against: every registered SAE's width (``widths`` adds SAEs attached
    without being registered) and which SAE each layer carries (``attached``: SAE id -> layer)."""
    known = {r["id"]: int(r["d_sae"]) for r in store.saes()}
    return Registered({**known, **(widths or {})}, {layer: sae for sae, layer in attached.items()})


def cluster_names(store: Store) -> set[str]:
    return {row["name"] for row in store.documents("cluster")}


def circuit_serving(store: Store, name: str, reg: Registered) -> Serving:
    """How the imported circuit ``name`` serves against ``reg`` (404 when there is no such circuit)."""
    row = store.document("circuit", name)
    if row is None:
        raise ProfileNotFound(f"No circuit is named '{name}'.", param="name")
    return stored_serving_mode(row["document"], reg, cluster_names(store))


class _Basis(NamedTuple):
    """What a request's steering starts from: its ``name``, whether its values are ``empty``, the
    profile whose circuit may back it, and its ``base`` (read only when the dial needs it)."""

    name: str
    empty: bool
    circuit: str | None
    base: Callable[[], Base]


class Bases:
    """The store's profiles, clusters and circuits seen against one model's attached SAEs."""

    def __init__(self, store: Store, target: SteeringTarget, settings: IntensitySettings) -> None:
        self.store = store
        self.target = target
        self.steering = target.steering
        self.settings = settings

    def registered(self) -> Registered:
        atts = self.steering.attachments.values()
        return registered(self.store, {a.sae_id: a.layer for a in atts}, {a.sae_id: a.sae.d_sae for a in atts})

    def serving(self, circuit: str) -> Serving:
        return circuit_serving(self.store, circuit, self.registered())

    def _entries(self, name: str) -> dict[str, dict[int, float]]:
        return resolve_entries(stored_profile(self.store, name), self.steering, self.target.model_id)

    def _cluster(self, name: str, kind: BaseKind) -> Base:
        found = stored_cluster(self.store, name)
        if found is None:
            raise ProfileNotFound(f"No cluster is named '{name}'.", param="profile")
        doc, dial = found
        return Base(kind, self._entries(name), doc.declared, dial)

    def base(self, name: str) -> Base:
        """The base profile ``name`` steers with: a cluster with its range and dial, a circuit as it serves
        now (natively, through its fallback cluster, or not at all), or a plain profile's entries."""
        backing = self.store.backing(name)
        if backing == "cluster":
            return self._cluster(name, BaseKind.CLUSTER)
        if backing == "circuit":
            serving = self.serving(name)
            if serving.mode is ServingMode.NONE:
                return Base(BaseKind.PLAIN, {})
            row = self.store.document("circuit", name)
            assert row is not None
            circuit = parse_shape("circuit", row["document"], stored=True)
            if serving.mode is ServingMode.SLICE_FALLBACK:
                return self._cluster(circuit.fallback_cluster, BaseKind.SLICE_FALLBACK)
            return Base(BaseKind.CIRCUIT, self._entries(name), circuit.declared)
        return Base(BaseKind.PLAIN, self._entries(name))

    def live(self) -> Base:
        return Base(BaseKind.PLAIN, {a.sae_id: dict(a.values) for a in self.steering.attachments.values()})

    def active(self) -> str | None:
        """The active profile, while it still exists."""
        name = self.steering.active_profile
        return name if name is not None and self.store.profile(name) is not None else None

    def circuit(self, name: str | None) -> str | None:
        """``name`` when it is a profile a circuit backs, else None."""
        return name if name is not None and self.store.backing(name) == "circuit" else None

    def activation(self, name: str) -> dict[str, dict[int, float]]:
        """The live values activating profile ``name`` sets: a plain profile's entries as they are; a
        cluster or circuit at its own dial (a cluster's stored λ), as it serves now."""
        if self.store.backing(name) is None:
            return self._entries(name)
        context = Context(dial_only=False, steering_enabled=self.steering.enabled,
                          sae_attached=bool(self.steering.attachments), base_empty=False)
        res = resolve(None, context, lambda: self.base(name), self.settings)
        return res.strengths if res.applies else {}

    def request(self, profile: str | None, dial: Dial, own: Strengths | None = None) -> RequestSteering:
        """A request's steering: ``profile`` (else the active profile, else the live values), or a chat's
        ``own`` values, scaled by ``dial``.

        A named profile (or ``own`` values) replaces the live values for the request even when it steers
        nothing; a dial on the active profile or the live values replaces them only when it changes
        steering, except "off" (or 0), which always pins the request unsteered. Without either, the live
        values run as the operator left them.
        """
        explicit = profile is not None or own is not None
        active = None if explicit else self.active()
        doc = self._profile_doc(profile or active)  # read once: scope and entries
        scope = doc.steering_scope if doc is not None else None
        if not explicit and dial is None:
            return RequestSteering(rung=self._rung(self.circuit(active), None), scope=scope)
        basis = self._basis(profile, own, active, doc)
        if explicit and not self.steering.attachments:
            return RequestSteering(basis.name, {})  # nothing to steer through: the request runs unsteered
        return self._resolved(dial, explicit, basis, scope)

    def _profile_doc(self, name: str | None) -> ProfileDoc | None:
        """The saved profile ``name`` as a document (404 when there is none); None when no profile is named."""
        return stored_profile(self.store, name) if name is not None else None

    def _basis(self, profile: str | None, own: Strengths | None, active: str | None,
               doc: ProfileDoc | None) -> _Basis:
        """What a request steers with, first of: the named ``profile``, the chat's ``own`` values, the ``active``
        profile, the live values (``doc`` is the profile's document, when one is named or active)."""
        if profile is not None:
            assert doc is not None
            return _Basis(profile, not doc.entries, profile, partial(self.base, profile))
        if own is not None:
            return _Basis(LIVE, not any(own.values()), None, partial(Base, BaseKind.PLAIN, own))
        if active is not None:
            assert doc is not None
            return _Basis(active, not doc.entries, active, partial(self.base, active))
        return _Basis(LIVE, not any(a.values for a in self.steering.attachments.values()), None, self.live)

    def _resolved(self, dial: Dial, explicit: bool, basis: _Basis, scope: Scope | None) -> RequestSteering:
        """The steering ``dial`` resolves from ``basis`` (``explicit``: a profile or own values were named), with
        the SAEs its values steer through pinned."""
        steering = self.steering
        context = Context(dial_only=not explicit, steering_enabled=steering.enabled,
                          sae_attached=bool(steering.attachments), base_empty=basis.empty)
        res = resolve(dial, context, basis.base, self.settings)
        # "off" pins the request unsteered even where the dial changes nothing now (no values, steering
        # disabled): following the live values instead, an operator change before it runs would steer it
        pins = explicit or dial is Symbol.OFF
        values = res.strengths if res.applies else {} if pins else None
        rows = RequestSteering(basis.name, values)  # what its rows steer with
        return RequestSteering(basis.name, values, res.echo, self._rung(self.circuit(basis.circuit), rows), scope,
                               self._pinned(values))

    def _pinned(self, values: Values | None) -> dict[str, Attachment]:
        """The attachments ``values`` steer through: each SAE they give values for that is attached."""
        return {sae: self.steering.attachments[sae] for sae, strengths in (values or {}).items()
                if strengths and sae in self.steering.attachments}

    def _rung(self, circuit: str | None, rows: RequestSteering | None) -> int | None:
        """The circuit's rung when it genuinely steers the response: serving natively, and something steers."""
        if circuit is None or self.steering.label(rows) == "none":
            return None
        return self.serving(circuit).rung
