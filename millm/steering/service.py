"""Steering as the front ends use it: the SAE registry, attachments, values and profiles, persisted.

This is the one way to steer from any front end. The CLI and the server share it: what ``millm sae
attach`` and ``millm steer set`` persist is what the next ``millm chat`` or ``millm serve`` of that
model starts with. Its methods change hooks, so the server runs each mutation as an engine command
(between decode steps, on the engine thread); the CLI, which has no other thread, calls them directly.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from millm.config import get_settings
from millm.errors import (
    InvalidParameter,
    MillmError,
    ProfileConflict,
    ProfileNotFound,
    SAENotAttached,
    SAENotFound,
)
from millm.paths import user_path
from millm.sae.bundled import register_bundled
from millm.sae.formats import load_sae
from millm.steering.bases import Bases, circuit_serving, profile_row, registered, stored_profile
from millm.steering.core import Attachment, RequestSteering
from millm.steering.documents import ClusterDoc, Document, Registered, Serving, ServingMode
from millm.steering.imports import import_document, stored_cluster
from millm.steering.intensity import Dial, IntensitySettings, check_stored_dial
from millm.steering.monitor import MonitorConfig, parse_monitor_config
from millm.steering.profiles import ProfileDoc, parse_profile
from millm.steering.sensors import sensor_for
from millm.steering.target import SteeringTarget
from millm.store import Store

if TYPE_CHECKING:
    from millm.sae.labels import LabelIndex

Kind = Literal["cluster", "circuit"]

ACTIVE_PROFILE_KEY = "active_profile"


def sae_id_for(path: Path) -> str:
    return "sae_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]


def _read_labels(path: Path) -> dict[int, str]:
    data = json.loads(path.read_text())
    if isinstance(data, dict):
        return {int(k): str(v) for k, v in data.items()}
    return {int(item["index"]): str(item["label"]) for item in data}


class SteeringService:
    """Registry, attachments, values, profiles, clusters and circuits over one store.

    ``intensity`` holds the dial's settings (MILLM_INTENSITY_MAX and the floors); by default the
    process settings'.
    """

    def __init__(self, store: Store, intensity: IntensitySettings | None = None) -> None:
        self.store = store
        register_bundled(store)  # the SAEs shipped for the bundled model, under their stable ids
        self.intensity = intensity or IntensitySettings.from_settings(get_settings())

    def bases(self, engine: SteeringTarget) -> Bases:
        """The store's profiles, clusters and circuits seen against ``engine``'s attached SAEs."""
        return Bases(self.store, engine, self.intensity)

    # SAEs
    def register_sae(self, path: str | Path, name: str | None = None,
                     labels: str | Path | None = None, sae_id: str | None = None) -> dict[str, Any]:
        """Read the SAE (so a malformed one is refused now) and record it; returns the SAE object. Its id is
        ``sae_id`` when given (``millm sae train --name``: the name is the id, as bundled SAEs' are), else
        derived from the path."""
        path = user_path(path).resolve()
        loaded = load_sae(path)
        label_file = Path(labels) if labels else (path if path.is_dir() else path.parent) / "labels.json"
        try:
            label_map = _read_labels(label_file) if label_file.is_file() else {}
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidParameter(f"{label_file}: labels must map feature index to label ({exc}).",
                                   param="labels") from None
        record = {"id": sae_id or sae_id_for(path), "name": name or path.name, "path": str(path),
                  "format": loaded.format, "architecture": loaded.sae.architecture, "d_in": loaded.sae.d_in,
                  "d_sae": loaded.sae.d_sae, "layer_hint": loaded.layer_hint, "model_hint": loaded.model_hint}
        self.store.add_sae(record, label_map)
        return record

    def sae(self, sae_id: str) -> dict[str, Any]:
        record = self.store.sae(sae_id)
        if record is None:
            raise SAENotFound(f"No SAE has id '{sae_id}'; see `millm sae list` or GET /api/saes.", param="sae")
        return record

    def label_index(self, sae_id: str) -> LabelIndex:
        """The SAE's registered labels, searchable, with the features its ``features.jsonl`` measured to steer:
        the one index the CLI, the TUI and the HTTP API name and rank its features by."""
        from millm.sae.cards import held_out_measures
        from millm.sae.labels import LabelIndex

        record = self.sae(sae_id)
        return LabelIndex(self.store.label_map(sae_id), sae_id, held_out_measures(record["path"]))

    def view(self, record: dict[str, Any], engine: SteeringTarget | None) -> dict[str, Any]:
        """The SAE object the API returns: the record plus where it is attached now."""
        att = engine.steering.attachments.get(record["id"]) if engine is not None else None
        out = {k: v for k, v in record.items() if k != "added"}
        return {**out, "attached_layer": att.layer if att is not None else None}

    def attach(self, engine: SteeringTarget, sae_id: str, layer: int | None = None) -> dict[str, Any]:
        """Attach (or re-attach) a registered SAE, all or nothing: the SAE is read and checked before the
        hook changes, and should re-deriving the active profile or persisting fail, the previous
        attachment (or none) is put back."""
        record = self.sae(sae_id)
        if layer is None:
            layer = record["layer_hint"]
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise InvalidParameter(f"SAE {sae_id} has no layer hint; give 'layer'.", param="layer")
        sae = load_sae(record["path"]).sae
        steering = engine.steering
        previous = steering.attachments.get(sae_id)
        steering.attach(sae_id, sae, layer)
        try:
            self.follow_active(engine)
            self.persist(engine)
        except BaseException:
            if previous is None:
                steering.detach(sae_id)
            else:
                steering.attach(sae_id, previous.sae, previous.layer)
            raise
        return self.view(record, engine)

    def detach(self, engine: SteeringTarget, sae_id: str) -> dict[str, Any]:
        record = self.sae(sae_id)
        engine.steering.detach(sae_id)
        self.follow_active(engine)
        self.persist(engine)
        return self.view(record, engine)

    # persisted live state, per model
    @staticmethod
    def _key(model_id: str) -> str:
        return f"steering:{model_id}"

    def attached_layers(self, model_id: str) -> dict[str, int]:
        """Persisted attachments of ``model_id``: SAE id to layer."""
        return self.store.get_state(self._key(model_id), {}).get("attachments", {})

    def persist(self, engine: SteeringTarget) -> None:
        s = engine.steering
        self.store.set_state(self._key(engine.model_id), {
            "enabled": s.enabled, "active_profile": s.active_profile,
            "attachments": {a.sae_id: a.layer for a in s.attachments.values()},
            "values": {a.sae_id: {str(f): v for f, v in a.values.items()} for a in s.attachments.values()}})

    def restore(self, engine: SteeringTarget | None) -> None:
        """Re-attach and re-apply what was persisted for this model (SAEs gone from disk are skipped)."""
        if engine is None:
            return
        state = self.store.get_state(self._key(engine.model_id))
        if not state:
            return
        s = engine.steering
        for sae_id, layer in state.get("attachments", {}).items():
            record = self.store.sae(sae_id)
            if record is not None and Path(record["path"]).exists():
                s.attach(sae_id, load_sae(record["path"]).sae, layer)
                s.set_values(sae_id, state.get("values", {}).get(sae_id, {}), merge=False)
        s.set_enabled(state.get("enabled", True))
        active = state.get("active_profile")
        s.active_profile = active if isinstance(active, str) and self.store.profile(active) is not None else None

    def set_values(self, engine: SteeringTarget, sae_id: str | None, values: Any, *, merge: bool) -> None:
        steering = engine.steering
        if sae_id is None:
            if len(steering.attachments) != 1:
                raise InvalidParameter("Name the SAE ('sae'): "
                                       f"{len(steering.attachments)} SAEs are attached.", param="sae")
            sae_id = next(iter(steering.attachments))
        self.sae(sae_id)
        steering.set_values(sae_id, values, merge=merge)
        self.persist(engine)

    def clear(self, engine: SteeringTarget) -> None:
        """Clear every live value (persisted)."""
        engine.steering.clear()
        self.persist(engine)

    def set_enabled(self, engine: SteeringTarget, enabled: bool) -> None:
        """Turn steering on or off, keeping the values (persisted)."""
        engine.steering.set_enabled(enabled)
        self.persist(engine)

    # profiles
    def profile(self, name: str) -> dict[str, Any]:
        return profile_row(self.store, name)

    def save_profile(self, doc: Any, *, overwrite: bool) -> dict[str, Any]:
        checked = parse_profile(doc)
        body = checked.model_dump()
        backing = self.store.backing(checked.name)
        if backing is not None:
            raise ProfileConflict(f"'{checked.name}' is an imported {backing}; change it by importing its {backing} "
                                  f"document again with overwrite, or delete the {backing} first.", param="name")
        if not self.store.save_profile(body, overwrite=overwrite):
            raise ProfileConflict(f"A profile named '{checked.name}' exists; overwrite it explicitly.", param="name")
        return self.profile(checked.name)

    def profile_from_current(self, engine: SteeringTarget, name: str, description: str = "") -> dict[str, Any]:
        entries = [{"sae": a.sae_id, "feature": f, "strength": v}
                   for a in engine.steering.attachments.values() for f, v in sorted(a.values.items())]
        return self.save_profile({"name": name, "description": description, "model": engine.model_id,
                                  "entries": entries}, overwrite=False)

    def delete_profile(self, name: str) -> None:
        """Delete a profile; one backed by a cluster or circuit goes with it (404 when unknown)."""
        self.profile(name)
        backing = self.store.backing(name)
        if backing is None:
            self.store.delete_profile(name)
        else:
            self.store.delete_document(backing, name)

    def for_request(self, engine: SteeringTarget, profile: str | None, dial: Dial) -> RequestSteering:
        """A request's own steering from its ``profile`` and ``steering_intensity`` (404 unknown profile,
        400 a profile that does not fit what is attached), with its headers' values."""
        return self.bases(engine).request(profile, dial)

    def profile_doc(self, name: str) -> ProfileDoc:
        """The saved profile as a document (404 when unknown)."""
        return stored_profile(self.store, name)

    def activate(self, engine: SteeringTarget, name: str) -> None:
        """Make a profile's values the live values; a cluster's at its stored dial, a circuit's as it serves now."""
        engine.steering.activate(name, self.bases(engine).activation(name))
        self.persist(engine)

    def follow_active(self, engine: SteeringTarget) -> None:
        """Re-derive the live values of an active cluster or circuit after what it depends on changed
        (an SAE attached or detached, a dial set): a circuit may now serve natively, through its
        fallback, or not at all. Values that no longer resolve are left as they are."""
        bases = self.bases(engine)
        name = bases.active()
        if name is None or self.store.backing(name) is None:
            return
        try:
            values = bases.activation(name)
        except MillmError:
            return
        engine.steering.activate(name, values)

    # clusters and circuits
    def registered(self, engine: SteeringTarget | None, model_id: str) -> Registered:
        """What a document is checked against: the loaded model's attachments, else those persisted for it."""
        if engine is not None:
            return self.bases(engine).registered()
        return registered(self.store, self.attached_layers(model_id))

    def import_document(self, kind: Kind, raw: Any, engine: SteeringTarget | None, model_id: str, *,
                        overwrite: bool) -> dict[str, Any]:
        """Check and store a cluster or circuit with its profile (400 naming the pointer, 409 a taken name)."""
        doc: Document = import_document(self.store, kind, raw, self.registered(engine, model_id), overwrite=overwrite)
        if engine is not None:
            self.follow_active(engine)
            self.persist(engine)
        return self.document(kind, doc.name)

    def document(self, kind: Kind, name: str) -> dict[str, Any]:
        """An imported cluster (with its dial) or circuit; 404 when there is none."""
        row = self.store.document(kind, name)
        if row is None:
            raise ProfileNotFound(f"No {kind} is named '{name}'.", param="name")
        return row

    def delete_document(self, kind: Kind, name: str) -> None:
        """Delete a cluster or circuit and the profile it backs (404 when there is none)."""
        if not self.store.delete_document(kind, name):
            raise ProfileNotFound(f"No {kind} is named '{name}'.", param="name")

    def set_cluster_dial(self, engine: SteeringTarget | None, name: str, value: Any) -> dict[str, Any]:
        """Set a cluster's persistent dial, bounded to [0, max] (400 outside); an active cluster (or a circuit
        served through it) is re-applied at once."""
        found = stored_cluster(self.store, name)
        if found is None:
            raise ProfileNotFound(f"No cluster is named '{name}'.", param="name")
        self.store.set_cluster_intensity(name, check_stored_dial(value, found[0].declared, self.intensity))
        if engine is not None:
            self.follow_active(engine)
            self.persist(engine)
        return self.document("cluster", name)

    def serving(self, engine: SteeringTarget | None, name: str, model_id: str) -> Serving:
        """How circuit ``name`` serves on the loaded model (else on the attachments persisted for ``model_id``)."""
        return circuit_serving(self.store, name, self.registered(engine, model_id))

    def active_profile(self, engine: SteeringTarget | None, model_id: str) -> str | None:
        """The active profile of the loaded model, else the one persisted for ``model_id``, while it exists."""
        name = (engine.steering.active_profile if engine is not None
                else self.store.get_state(self._key(model_id), {}).get("active_profile"))
        return name if name is not None and self.store.profile(name) is not None else None

    def active_circuit(self, engine: SteeringTarget | None, model_id: str) -> str | None:
        """The active profile when a circuit backs it."""
        name = self.active_profile(engine, model_id)
        return name if name is not None and self.store.backing(name) == "circuit" else None

    def circuit_state(self, engine: SteeringTarget | None, model_id: str) -> dict[str, Any]:
        """GET /api/circuits/active: the active circuit and its ``steering`` field (mode, rung, language, reason)."""
        name = self.active_circuit(engine, model_id)
        serving = (self.serving(engine, name, model_id) if name is not None
                   else Serving(ServingMode.NONE, "no circuit is active"))
        return {"active": name, "steering": serving.steering_field()}

    def deactivate(self, engine: SteeringTarget) -> None:
        """Remove the live values the active profile set (persisted). While a profile is active every live
        value is one it set (an operator's own change ends the activation), so they all go; with no active
        profile the live values are the operator's and nothing changes."""
        if engine.steering.active_profile is None:
            return
        self.clear(engine)

    # cluster sensing (millm.steering.sensors): held by the cluster's SAE attachment, so a detach ends it
    def sense_cluster(self, engine: SteeringTarget, name: str, min_members: Any = 1) -> dict[str, Any]:
        """Switch sensing on for cluster ``name`` (again: with these settings): its SAE must be attached to a
        model whose residual can be read, and each member must have a threshold (given, or derived from the
        SAE's card); every refusal comes before anything changes. Returns what it senses."""
        from millm.sae.cards import feature_rows

        found = stored_cluster(self.store, name)
        if found is None:
            raise ProfileNotFound(f"No cluster is named '{name}'.", param="name")
        cluster = found[0]
        if not engine.reads:
            raise InvalidParameter(f"'{engine.model_id}' is steered through llama.cpp's control vectors, which read "
                                   "nothing; sense clusters on a transformers model.", param="model")
        att = self._cluster_attachment(engine, cluster)
        record = self.store.sae(att.sae_id)
        rows = feature_rows(record["path"]) if record is not None else {}
        tops = {i: float(r["max_activation"]) for i, r in rows.items() if r.get("max_activation") is not None}
        sensor = sensor_for(cluster, att.sae_id, tops, min_members)
        self.stop_sensing(engine, name)
        att.sensors[name] = sensor
        return sensor.describe()

    def stop_sensing(self, engine: SteeringTarget | None, name: str) -> bool:
        """Switch sensing off for cluster ``name``; False when it was not on."""
        if engine is None:
            return False
        held = [a for a in engine.steering.attachments.values() if name in a.sensors]
        for att in held:
            del att.sensors[name]
        return bool(held)

    @staticmethod
    def cluster_sensing(engine: SteeringTarget | None, name: str) -> dict[str, Any] | None:
        """What cluster ``name`` senses on the loaded model (None: it does not)."""
        for att in engine.steering.attachments.values() if engine is not None else ():
            if name in att.sensors:
                return att.sensors[name].describe()
        return None

    @staticmethod
    def _cluster_attachment(engine: SteeringTarget, cluster: ClusterDoc) -> Attachment:
        """The attached SAE a cluster lives on (the one it names, else the one attached at its layer), of its
        width; a 400 naming ``sae`` when there is none."""
        sae = cluster.sae
        for att in engine.steering.attachments.values():
            named = att.sae_id == sae.id if sae.id is not None else (
                att.layer == sae.layer and att.sae.architecture != "linear")
            if named and att.sae.d_sae == sae.d_sae:
                return att
        which = f"SAE {sae.id}" if sae.id is not None else f"an SAE of width {sae.d_sae} at layer {sae.layer}"
        raise SAENotAttached(f"Cluster '{cluster.name}' lives on {which}, which is not attached to the loaded model; "
                             "attach it first (POST /api/saes/{id}/attach).", param="sae")

    # monitoring
    def configure_monitor(self, engine: SteeringTarget, data: dict[str, Any]) -> dict[str, Any]:
        """Check and apply a monitoring configuration; returns the configuration now in force."""
        config: MonitorConfig = parse_monitor_config(data, engine.steering, engine.monitor.config.history)
        if config.enabled and not engine.reads:  # a GGUF model: llama.cpp's residual cannot be read
            raise InvalidParameter(f"'{engine.model_id}' is steered through llama.cpp's control vectors, which read "
                                   "nothing; monitor a transformers model.", param="enabled")
        engine.monitor.configure(config)
        return engine.monitor.describe()

    def export(self, name: str) -> dict[str, Any]:
        """The profile document, as import takes it."""
        found = self.profile(name)
        return {k: found[k] for k in ("name", "description", "model", "entries", "steering_scope")}
