"""Per-request SAE activations (``return_sae_activations``): checking the ask, recording, reporting."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from millm.errors import InvalidFeatureIndex, InvalidParameter

if TYPE_CHECKING:
    import torch

    from millm.steering.core import SteeringCore

SAE_ACTIVATIONS_MAX_TOP_K = 64
SAE_ACTIVATIONS_MAX_ENTRIES = 65_536
DEFAULT_TOP_K = 8
POSITION_MODES = ("last", "prompt", "completion", "all")
READ_POINTS = ("post_steering", "pre_steering")
FLAGS = ("token_text", "labels")  # opt-in additions to each position (token) and each feature (label)
FIELD = "return_sae_activations"
# the keys a return_sae_activations object may hold (the field table reports or refuses any other)
READOUT_KEYS = {"sae_id", "features", "top_k", "positions", "read_point", "token_text", "labels"}
UNSTEERED = "unsteered"  # the read point of a scoring pass: every SAE's steering suppressed
NOTES = {
    "post_steering": "post_steering is what the model computed at this layer for this request; it is not an "
                     "unsteered counterfactual: steering at earlier layers, and tokens generated under steering, "
                     "still shape the residual here.",
    "pre_steering": "pre_steering removes only this layer's own steering delta; it is not an unsteered "
                    "counterfactual: steering at earlier layers, and tokens generated under steering, still shape "
                    "the residual here.",
    UNSTEERED: "Scoring is never steered: every SAE's steering is suppressed for this pass, so this is what the "
               "unsteered model computed at this layer for this prompt. Nothing is generated, so no completion "
               "position has an activation.",
}


def _bad(message: str, key: str | None = None) -> InvalidParameter:
    return InvalidParameter(message, param=f"{FIELD}.{key}" if key else FIELD)


def check_readout_rows(rows: int) -> None:
    """A read-out has one position axis: exactly one prompt answered once."""
    if rows != 1:
        raise _bad(f"'{FIELD}' needs exactly one prompt and n = 1 (n > 1, extra_messages and prompt lists have "
                   "no single position axis).")


Positions = str | tuple[int, int]  # one of POSITION_MODES, or a half-open [start, end) range


@dataclass(frozen=True)
class ReadoutAsk:
    """A ``return_sae_activations`` ask whose shape is checked (what the request builder decides, before any
    model is named); which SAE it reads, and the limits that depend on it, are bound by :func:`bind_readout`."""

    sae_id: str | None = None
    features: tuple[int, ...] | None = None
    top_k: int | None = None
    positions: Positions = "last"
    read_point: str = "post_steering"
    token_text: bool = False  # each position also carries its decoded token text ("token")
    labels: bool = False  # each feature also carries its label ("label", null where the SAE has none)


@dataclass(frozen=True)
class ReadoutSpec:
    """A read-out bound to an attached SAE: what the engine records."""

    sae_id: str
    layer: int
    features: list[int] | None
    top_k: int
    positions: Positions
    read_point: str
    token_text: bool = False
    labels: bool = False


def _features(raw: Any) -> tuple[int, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw or not all(isinstance(f, int) and not isinstance(f, bool) for f in raw):
        raise _bad(f"'{FIELD}.features' must be a non-empty list of feature indices.", "features")
    return tuple(dict.fromkeys(raw))


def _top_k(raw: Any) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise _bad(f"'{FIELD}.top_k' must be a positive integer.", "top_k")
    if raw > SAE_ACTIVATIONS_MAX_TOP_K:
        raise _bad(f"'{FIELD}.top_k' is {raw}, over SAE_ACTIVATIONS_MAX_TOP_K ({SAE_ACTIVATIONS_MAX_TOP_K}).", "top_k")
    return raw


def _positions(raw: Any) -> Positions:
    if isinstance(raw, dict):
        start, end = raw.get("start"), raw.get("end")
        if (set(raw) != {"start", "end"} or not isinstance(start, int) or not isinstance(end, int)
                or isinstance(start, bool) or isinstance(end, bool) or not 0 <= start < end):
            raise _bad(f"'{FIELD}.positions' range must be {{\"start\": int, \"end\": int}} with 0 <= start < end.",
                       "positions")
        return start, end
    if raw not in POSITION_MODES:
        raise _bad(f"'{FIELD}.positions' must be one of {', '.join(POSITION_MODES)} or a start/end range.",
                   "positions")
    return str(raw)


def check_readout(raw: Any) -> ReadoutAsk:
    """The shape of a ``return_sae_activations`` object (its keys, types and the bounds that depend on nothing
    loaded); a 400 naming the key otherwise."""
    if not isinstance(raw, dict):
        raise _bad(f"'{FIELD}' must be an object.")
    if unknown := sorted(set(raw) - READOUT_KEYS):
        raise _bad(f"'{FIELD}' has unknown keys: {', '.join(unknown)}.", unknown[0])
    sae_id = raw.get("sae_id")
    if sae_id is not None and not isinstance(sae_id, str):
        raise _bad(f"'{FIELD}.sae_id' must be a string.", "sae_id")
    read_point = raw.get("read_point", "post_steering")
    if read_point not in READ_POINTS:
        raise _bad(f"'{FIELD}.read_point' must be post_steering or pre_steering.", "read_point")
    flags = {key: raw.get(key, False) for key in FLAGS}
    for key, value in flags.items():
        if not isinstance(value, bool):
            raise _bad(f"'{FIELD}.{key}' must be true or false.", key)
    return ReadoutAsk(sae_id, _features(raw.get("features")), _top_k(raw.get("top_k")),
                      _positions(raw.get("positions", "last")), str(read_point), **flags)


def _read_sae(ask: ReadoutAsk, attached: Mapping[str, Any]) -> str:
    """The attached SAE the ask reads: the one it names, else the only one attached."""
    if not attached:
        raise _bad(f"'{FIELD}': no SAE is attached to the loaded model.", "sae_id")
    if ask.sae_id is None and len(attached) > 1:
        raise _bad(f"'{FIELD}.sae_id' is needed: several SAEs are attached ({', '.join(attached)}).", "sae_id")
    sae_id = ask.sae_id if ask.sae_id is not None else next(iter(attached))
    if sae_id not in attached:
        raise _bad(f"'{FIELD}.sae_id' {sae_id!r} is not attached (attached: {', '.join(attached)}).", "sae_id")
    return sae_id


def _position_count(positions: Positions, prompt_tokens: int, max_tokens: int) -> int:
    """How many positions the ask could read: a range's length, or what its mode covers at most."""
    if isinstance(positions, tuple):
        return positions[1] - positions[0]
    return {"last": 1, "prompt": prompt_tokens, "completion": max_tokens, "all": prompt_tokens + max_tokens}[positions]


def bind_readout(ask: ReadoutAsk, steering: SteeringCore, *, rows: int, prompt_tokens: int,
                 max_tokens: int) -> ReadoutSpec:
    """``ask`` bound to the attached SAE it reads, checked against that SAE and the request's size."""
    check_readout_rows(rows)
    attached = steering.attachments
    sae_id = _read_sae(ask, attached)
    att = attached[sae_id]
    if bad := [f for f in ask.features or () if not 0 <= f < att.sae.d_sae]:
        raise InvalidFeatureIndex(f"'{FIELD}.features' has {bad[0]}, outside this SAE's 0-{att.sae.d_sae - 1}.",
                                  param=f"{FIELD}.features")
    default_k = min(len(ask.features), SAE_ACTIVATIONS_MAX_TOP_K) if ask.features else DEFAULT_TOP_K
    top_k = ask.top_k if ask.top_k is not None else default_k
    count = _position_count(ask.positions, prompt_tokens, max_tokens)
    if count * top_k > SAE_ACTIVATIONS_MAX_ENTRIES:
        raise _bad(f"'{FIELD}' could return {count} positions x top_k {top_k} = {count * top_k} entries, over "
                   f"SAE_ACTIVATIONS_MAX_ENTRIES ({SAE_ACTIVATIONS_MAX_ENTRIES}); narrow positions or top_k.")
    features = list(ask.features) if ask.features is not None else None
    return ReadoutSpec(sae_id, att.layer, features, top_k, ask.positions, ask.read_point, ask.token_text, ask.labels)


def with_labels(body: dict[str, Any], labels: Mapping[int, str]) -> dict[str, Any]:
    """A read-out body whose every feature also carries its ``label`` (None where ``labels`` has none)."""
    positions = [{**p, "features": [{**f, "label": labels.get(f["index"])} for f in p["features"]]}
                 for p in body["positions"]]
    return {**body, "positions": positions}


LabelSource = Callable[[str], Mapping[int, str]]  # an SAE id's feature labels


TokenTexts = Callable[[list[int]], list[str]]  # each token's text in context (the engine's detokeniser)


def asks_labels(ask: ReadoutAsk | None) -> bool:
    """Whether a read-out ask wants each feature's label."""
    return ask is not None and ask.labels


@dataclass
class ReadoutRecorder:
    """Encodes each forward's residual at the SAE's layer and keeps the top_k per position."""

    spec: ReadoutSpec
    steering: SteeringCore
    texts: TokenTexts | None = None  # the positions' texts when the ask has token_text (handed in by the engine)
    values: list[torch.Tensor] = field(default_factory=list)
    indices: list[torch.Tensor] = field(default_factory=list)

    def __call__(self, hidden: torch.Tensor) -> None:
        import torch

        sae = self.steering.attachments[self.spec.sae_id].sae
        feats = None if self.spec.features is None else torch.tensor(self.spec.features, device=hidden.device)
        acts = sae.encode(hidden[0], feats).float()
        top = acts.topk(min(self.spec.top_k, acts.shape[-1]), dim=-1)
        index = top.indices if feats is None else feats[top.indices]
        self.values.append(top.values.cpu())
        self.indices.append(index.cpu())

    def selected(self, read: int, prompt_tokens: int) -> list[int]:
        """The positions to report, among the ``read`` positions that have an activation."""
        mode = self.spec.positions
        if mode == "last":
            return [read - 1] if read else []
        if mode == "prompt":
            return list(range(min(prompt_tokens, read)))
        if mode == "completion":
            return list(range(prompt_tokens, read))
        if mode == "all":
            return list(range(read))
        assert isinstance(mode, tuple)
        start, end = mode
        return list(range(start, min(end, read)))

    def result(self, token_ids: list[int], prompt_tokens: int) -> dict[str, Any]:
        import torch

        values = torch.cat(self.values) if self.values else torch.zeros(0, 0)
        indices = torch.cat(self.indices) if self.indices else torch.zeros(0, 0, dtype=torch.long)
        keep_zeros = self.spec.features is not None
        selected = self.selected(values.shape[0], prompt_tokens)
        texts = self._token_texts(token_ids, selected)
        positions = []
        for p in selected:
            feats = [{"index": int(i), "value": round(float(v), 6)}
                     for v, i in zip(values[p].tolist(), indices[p].tolist()) if keep_zeros or v > 0]
            text = {"token": texts[p]} if self.spec.token_text else {}
            positions.append({"position": p, "token_id": token_ids[p], **text, "features": feats})
        return {"sae_id": self.spec.sae_id, "layer": self.spec.layer, "read_point": self.spec.read_point,
                "positions": positions, "note": NOTES[self.spec.read_point]}

    def _token_texts(self, token_ids: list[int], selected: list[int]) -> list[str]:
        """Each token's text up to the last position read, where the ask wants them (token_text)."""
        if not (self.spec.token_text and selected):
            return []
        assert self.texts is not None, "a read-out with token_text needs the engine's detokeniser"
        return self.texts(token_ids[:selected[-1] + 1])
