"""Cluster and circuit documents: their shapes, checking them against what is registered, serving modes.

Pure: the registered SAEs come in as plain data (``Registered``), nothing here touches torch or the
store. Every refusal is a 400 whose message and ``param`` name the JSON pointer of the bad field
(``/members/3/feature``), so a client can point at it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from millm.errors import InvalidFeatureIndex, InvalidParameter, MillmError
from millm.names import STORED, Name
from millm.steering.intensity import ENVELOPE
from millm.steering.rung import RUNGS, rung_language

Lambda = Annotated[float, Field(ge=ENVELOPE[0], le=ENVELOPE[1])]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class _Document(_Strict):
    """What clusters and circuits share."""

    name: Name
    model: str
    description: str = ""
    intensity_range: list[Lambda] | None = Field(None, min_length=2, max_length=2)

    @field_validator("intensity_range")
    @classmethod
    def _ordered(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and value[0] > value[1]:
            raise ValueError(f"lo {value[0]:g} is above hi {value[1]:g}")
        return value

    @property
    def declared(self) -> tuple[float, float] | None:
        """The declared intensity_range as a (lo, hi) pair, for the intensity resolver."""
        return (self.intensity_range[0], self.intensity_range[1]) if self.intensity_range else None


class ClusterSAE(_Strict):
    """The one SAE a cluster lives on: its layer and width, and a registered id or a free-text hint."""

    layer: int = Field(ge=0)
    d_sae: int = Field(ge=1)
    id: str | None = None
    hint: str | None = None


class ClusterMember(_Strict):
    """One feature of a cluster: its steering strength, and (for sensing) the activation of that feature it must
    exceed (``threshold``; default: derived from the SAE's card when sensing is switched on)."""

    feature: int = Field(ge=0)
    strength: float
    label: str | None = None
    threshold: float | None = Field(None, gt=0)


class ClusterDoc(_Document):
    """``{"kind": "cluster", "name", "model", "sae": {...}, "members": [...], "intensity_range"?, "description"?}``."""

    kind: Literal["cluster"]
    sae: ClusterSAE
    members: list[ClusterMember] = Field(min_length=1)


class CircuitMember(_Strict):
    layer: int = Field(ge=0)
    sae: str | None = None
    feature: int = Field(ge=0)
    strength: float
    label: str | None = None


class Evidence(_Strict):
    """The evidence behind a circuit; ``rung`` places it on the ladder, other fields are kept as given."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    rung: int = Field(ge=RUNGS.start, le=RUNGS.stop - 1)


class CircuitDoc(_Document):
    """``{"kind": "circuit", "name", "model", "members": [...], "evidence": {"rung"}, "fallback_cluster"?, ...}``."""

    kind: Literal["circuit"]
    members: list[CircuitMember] = Field(min_length=1)
    evidence: Evidence
    fallback_cluster: Name | None = None


Document = ClusterDoc | CircuitDoc


@dataclass(frozen=True)
class Registered:
    """What the server has, as plain data: each registered SAE's width, and which SAE each layer carries."""

    widths: Mapping[str, int] = field(default_factory=dict)  # SAE id -> d_sae
    attached: Mapping[int, str] = field(default_factory=dict)  # layer -> id of the SAE attached there

    def width_at(self, layer: int) -> int | None:
        """The width of the SAE attached at ``layer``, or None when none is."""
        sae = self.attached.get(layer)
        return None if sae is None else self.widths.get(sae)


def pointer(loc: tuple[int | str, ...]) -> str:
    """An RFC 6901 JSON pointer for a pydantic error location."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in loc)


def _refuse(kind: str, where: str, problem: str, error: type[MillmError] = InvalidParameter) -> MillmError:
    return error(f"Invalid {kind} document at {where}: {problem}.", param=where)


MODELS: dict[str, type[ClusterDoc] | type[CircuitDoc]] = {"cluster": ClusterDoc, "circuit": CircuitDoc}


def parse_shape(kind: Literal["cluster", "circuit"], doc: Any, *, stored: bool = False) -> Any:
    """The document's shape only (types, ranges, names), not checked against what is registered.

    Enough for a document read back from the store (``stored``), which was checked when it was imported;
    its names are not held to the name rule again, so one stored before the rule stays usable, as a
    profile's does.
    """
    model = MODELS[kind]
    if not isinstance(doc, dict):
        raise _refuse(kind, "/", "must be a JSON object")
    if doc.get("kind") != kind:
        raise _refuse(kind, "/kind", f"must be \"{kind}\", got {doc.get('kind')!r}")
    try:
        return model.model_validate(doc, context=STORED if stored else None)
    except ValidationError as exc:
        first = exc.errors()[0]
        msg = str(first["msg"]).removeprefix("Value error, ")
        raise _refuse(kind, pointer(tuple(first["loc"])), msg[:1].lower() + msg[1:]) from None


def parse_cluster(doc: Any, registered: Registered) -> ClusterDoc:
    """A checked cluster document: its shape, then its SAE and features against what is registered."""
    cluster: ClusterDoc = parse_shape("cluster", doc)
    sae = cluster.sae
    if sae.id is not None:
        if sae.id not in registered.widths:
            raise _refuse("cluster", "/sae/id", f"no SAE with id '{sae.id}' is registered (give 'hint' instead "
                                                "for a document meant for other machines)")
        width: int | None = registered.widths[sae.id]
        source = f"SAE {sae.id}"
    else:
        width = registered.width_at(sae.layer)
        source = f"the SAE attached at layer {sae.layer} ({registered.attached.get(sae.layer)})"
    if width is not None and width != sae.d_sae:
        raise _refuse("cluster", "/sae/d_sae", f"{sae.d_sae} does not match {source}, whose d_sae is {width}")
    seen: dict[int, int] = {}
    for i, member in enumerate(cluster.members):
        where = f"/members/{i}/feature"
        if member.feature >= sae.d_sae:
            raise _refuse("cluster", where, f"feature {member.feature} is outside the SAE's 0-{sae.d_sae - 1}",
                          InvalidFeatureIndex)
        if member.feature in seen:
            raise _refuse("cluster", where, f"feature {member.feature} is already member {seen[member.feature]}")
        seen[member.feature] = i
    return cluster


def parse_circuit(doc: Any, registered: Registered) -> CircuitDoc:
    """A checked circuit document: its shape, then each member against the SAE it names or its layer carries.

    A member whose layer has no SAE attached (and that names none) cannot be checked yet: the circuit
    will serve in slice_fallback mode or not at all until one is attached.
    """
    circuit: CircuitDoc = parse_shape("circuit", doc)
    layer_sae: dict[int, tuple[str, int]] = {}
    seen: dict[tuple[int, int], int] = {}
    for i, m in enumerate(circuit.members):
        if m.sae is not None:
            if m.sae not in registered.widths:
                raise _refuse("circuit", f"/members/{i}/sae", f"no SAE with id '{m.sae}' is registered")
            named = layer_sae.setdefault(m.layer, (m.sae, i))
            if named[0] != m.sae:
                raise _refuse("circuit", f"/members/{i}/sae", f"layer {m.layer} is given SAE {named[0]} by "
                                                              f"member {named[1]}; one layer carries one SAE")
            width = registered.widths.get(m.sae)
        else:
            width = registered.width_at(m.layer)
        where = f"/members/{i}/feature"
        if width is not None and m.feature >= width:
            raise _refuse("circuit", where, f"feature {m.feature} is outside the 0-{width - 1} of the SAE for "
                                            f"layer {m.layer}", InvalidFeatureIndex)
        if (m.layer, m.feature) in seen:
            raise _refuse("circuit", where, f"feature {m.feature} at layer {m.layer} is already member "
                                            f"{seen[(m.layer, m.feature)]}")
        seen[(m.layer, m.feature)] = i
    return circuit


def parse_document(doc: Any, registered: Registered) -> Document:
    """A cluster or a circuit, by its ``kind``."""
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind == "cluster":
        return parse_cluster(doc, registered)
    if kind == "circuit":
        return parse_circuit(doc, registered)
    raise InvalidParameter(f"Invalid document at /kind: must be \"cluster\" or \"circuit\", got {kind!r}.",
                           param="/kind")


def profile_for(doc: Document) -> dict[str, Any]:
    """The profile of the same name an imported cluster or circuit is backed by.

    Entries name the SAE by id where the document gives one, else by layer (an SAE attached there).
    """
    if isinstance(doc, ClusterDoc):
        sae: str | int = doc.sae.id if doc.sae.id is not None else doc.sae.layer
        entries = [{"sae": sae, "feature": m.feature, "strength": m.strength} for m in doc.members]
    else:
        entries = [{"sae": m.sae if m.sae is not None else m.layer, "feature": m.feature, "strength": m.strength}
                   for m in doc.members]
    return {"name": doc.name, "description": doc.description, "model": doc.model, "entries": entries}


def stored_form(doc: Document) -> dict[str, Any]:
    """The document as it is stored and exported (checked, unknown top-level fields dropped)."""
    return {"kind": doc.kind, **doc.model_dump(exclude_none=True)}


class ServingMode(StrEnum):
    NATIVE = "native"
    SLICE_FALLBACK = "slice_fallback"
    NONE = "none"


@dataclass(frozen=True)
class Serving:
    """How a circuit serves now, and why; ``steering_field`` is GET /api/circuits/active's ``steering``."""

    mode: ServingMode
    reason: str
    rung: int | None = None  # only while the circuit itself steers (native)

    def steering_field(self) -> dict[str, Any]:
        return {"mode": self.mode.value, "rung": self.rung,
                "language": rung_language(self.rung) if self.rung is not None else None, "reason": self.reason}


def _native_gap(circuit: CircuitDoc, registered: Registered) -> str | None:
    """Why ``circuit`` cannot serve natively, or None when every member layer has a fitting SAE attached."""
    for i, m in enumerate(circuit.members):
        attached = registered.attached.get(m.layer)
        if attached is None:
            return f"no SAE is attached at layer {m.layer} (member {i})"
        if m.sae is not None and attached != m.sae:
            return f"layer {m.layer} carries SAE {attached}, not {m.sae} (member {i})"
        width = registered.widths.get(attached)
        if width is not None and m.feature >= width:
            return f"feature {m.feature} (member {i}) is past the width {width} of SAE {attached} at layer {m.layer}"
    return None


def serving_mode(circuit: CircuitDoc, registered: Registered, clusters: Collection[str]) -> Serving:
    """native when every member layer has its SAE attached; else slice_fallback through an imported
    fallback cluster; else none (the circuit does not steer)."""
    gap = _native_gap(circuit, registered)
    if gap is None:
        layers = ", ".join(str(layer) for layer in sorted({m.layer for m in circuit.members}))
        return Serving(ServingMode.NATIVE, f"every member layer ({layers}) has an SAE attached", circuit.evidence.rung)
    if circuit.fallback_cluster is None:
        return Serving(ServingMode.NONE, f"{gap}, and the circuit names no fallback_cluster")
    if circuit.fallback_cluster not in clusters:
        return Serving(ServingMode.NONE, f"{gap}, and its fallback cluster '{circuit.fallback_cluster}' "
                                         "is not imported")
    return Serving(ServingMode.SLICE_FALLBACK, f"{gap}; serving through cluster '{circuit.fallback_cluster}'")


def stored_serving_mode(stored: Any, registered: Registered, clusters: Collection[str]) -> Serving:
    """``serving_mode`` for a stored definition; one that no longer parses serves none, saying why."""
    try:
        circuit: CircuitDoc = parse_shape("circuit", stored, stored=True)
    except InvalidParameter as exc:
        return Serving(ServingMode.NONE, f"the stored definition does not parse: {exc.message}")
    return serving_mode(circuit, registered, clusters)
