"""Per-request SAE activations (``return_sae_activations``): checking the ask, recording, reporting."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from millm.engine.detok import IncrementalDetokenizer
from millm.errors import InvalidFeatureIndex, InvalidParameter
from millm.fields import READOUT_KEYS

if TYPE_CHECKING:
    import torch

    from millm.steering.controller import Steering

SAE_ACTIVATIONS_MAX_TOP_K = 64
SAE_ACTIVATIONS_MAX_ENTRIES = 65_536
DEFAULT_TOP_K = 8
POSITION_MODES = ("last", "prompt", "completion", "all")
READ_POINTS = ("post_steering", "pre_steering")
FLAGS = ("token_text", "labels")  # opt-in additions to each position (token) and each feature (label)
FIELD = "return_sae_activations"
NOTES = {
    "post_steering": "post_steering is what the model computed at this layer for this request; it is not an "
                     "unsteered counterfactual: steering at earlier layers, and tokens generated under steering, "
                     "still shape the residual here.",
    "pre_steering": "pre_steering removes only this layer's own steering delta; it is not an unsteered "
                    "counterfactual: steering at earlier layers, and tokens generated under steering, still shape "
                    "the residual here.",
}


def _bad(message: str, key: str | None = None) -> InvalidParameter:
    return InvalidParameter(message, param=f"{FIELD}.{key}" if key else FIELD)


def check_readout_rows(rows: int) -> None:
    """A read-out has one position axis: exactly one prompt answered once."""
    if rows != 1:
        raise _bad(f"'{FIELD}' needs exactly one prompt and n = 1 (n > 1, extra_messages and prompt lists have "
                   "no single position axis).")


@dataclass(frozen=True)
class ReadoutSpec:
    sae_id: str
    layer: int
    features: list[int] | None
    top_k: int
    positions: str | tuple[int, int]
    read_point: str
    token_text: bool = False  # each position also carries its decoded token text ("token")
    labels: bool = False  # each feature also carries its label ("label", null where the SAE has none)


def parse_readout(raw: Any, steering: Steering, *, rows: int, prompt_tokens: int, max_tokens: int) -> ReadoutSpec:
    """Check a ``return_sae_activations`` object against the request and the attached SAEs."""
    if not isinstance(raw, dict):
        raise _bad(f"'{FIELD}' must be an object.")
    if unknown := sorted(set(raw) - READOUT_KEYS):
        raise _bad(f"'{FIELD}' has unknown keys: {', '.join(unknown)}.", unknown[0])
    check_readout_rows(rows)
    if not steering.attachments:
        raise _bad(f"'{FIELD}': no SAE is attached to the loaded model.", "sae_id")
    sae_id = raw.get("sae_id")
    if sae_id is None:
        if len(steering.attachments) > 1:
            raise _bad(f"'{FIELD}.sae_id' is needed: several SAEs are attached ({', '.join(steering.attachments)}).",
                       "sae_id")
        sae_id = next(iter(steering.attachments))
    if sae_id not in steering.attachments:
        raise _bad(f"'{FIELD}.sae_id' {sae_id!r} is not attached (attached: {', '.join(steering.attachments)}).",
                   "sae_id")
    att = steering.attachments[sae_id]
    features = raw.get("features")
    if features is not None:
        if not isinstance(features, list) or not features or not all(
                isinstance(f, int) and not isinstance(f, bool) for f in features):
            raise _bad(f"'{FIELD}.features' must be a non-empty list of feature indices.", "features")
        if bad := [f for f in features if not 0 <= f < att.sae.d_sae]:
            raise InvalidFeatureIndex(f"'{FIELD}.features' has {bad[0]}, outside this SAE's 0-{att.sae.d_sae - 1}.",
                                      param=f"{FIELD}.features")
        features = list(dict.fromkeys(features))
    default_k = min(len(features), SAE_ACTIVATIONS_MAX_TOP_K) if features else DEFAULT_TOP_K
    top_k = raw.get("top_k", default_k)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise _bad(f"'{FIELD}.top_k' must be a positive integer.", "top_k")
    if top_k > SAE_ACTIVATIONS_MAX_TOP_K:
        raise _bad(f"'{FIELD}.top_k' is {top_k}, over SAE_ACTIVATIONS_MAX_TOP_K ({SAE_ACTIVATIONS_MAX_TOP_K}).",
                   "top_k")
    positions = raw.get("positions", "last")
    if isinstance(positions, dict):
        start, end = positions.get("start"), positions.get("end")
        if (set(positions) != {"start", "end"} or not isinstance(start, int) or not isinstance(end, int)
                or isinstance(start, bool) or isinstance(end, bool) or not 0 <= start < end):
            raise _bad(f"'{FIELD}.positions' range must be {{\"start\": int, \"end\": int}} with 0 <= start < end.",
                       "positions")
        positions = (start, end)
        count = end - start
    elif positions in POSITION_MODES:
        count = {"last": 1, "prompt": prompt_tokens, "completion": max_tokens,
                 "all": prompt_tokens + max_tokens}[positions]
    else:
        raise _bad(f"'{FIELD}.positions' must be one of {', '.join(POSITION_MODES)} or a start/end range.",
                   "positions")
    read_point = raw.get("read_point", "post_steering")
    if read_point not in READ_POINTS:
        raise _bad(f"'{FIELD}.read_point' must be post_steering or pre_steering.", "read_point")
    flags = {key: raw.get(key, False) for key in FLAGS}
    for key, value in flags.items():
        if not isinstance(value, bool):
            raise _bad(f"'{FIELD}.{key}' must be true or false.", key)
    if count * top_k > SAE_ACTIVATIONS_MAX_ENTRIES:
        raise _bad(f"'{FIELD}' could return {count} positions x top_k {top_k} = {count * top_k} entries, over "
                   f"SAE_ACTIVATIONS_MAX_ENTRIES ({SAE_ACTIVATIONS_MAX_ENTRIES}); narrow positions or top_k.")
    return ReadoutSpec(sae_id, att.layer, features, top_k, positions, read_point, **flags)


class _KeepSpecial:
    """A tokenizer whose decode keeps special tokens: a read-out's texts cover every position it reports
    (a chat template's ``<|im_start|>`` included), so they join to the text the model read."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))


def token_texts(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each token's text in context, joining to the decoded ``ids``: decoded incrementally as generation is
    (``millm.engine.detok``), so a SentencePiece token keeps the leading space its neighbour gives it, and a
    token that ends mid-way through a character has "" while the token completing it carries the character."""
    detok = IncrementalDetokenizer(_KeepSpecial(tokenizer))
    texts = [detok.push(token) for token in ids]
    if texts:
        texts[-1] += detok.flush()
    return texts


def with_labels(body: dict[str, Any], labels: Mapping[int, str]) -> dict[str, Any]:
    """A read-out body whose every feature also carries its ``label`` (None where ``labels`` has none)."""
    positions = [{**p, "features": [{**f, "label": labels.get(f["index"])} for f in p["features"]]}
                 for p in body["positions"]]
    return {**body, "positions": positions}


LabelSource = Callable[[str], Mapping[int, str]]  # an SAE id's feature labels


def asks_labels(ask: Any) -> bool:
    """Whether a ``return_sae_activations`` ask (already checked by :func:`parse_readout`) wants labels."""
    return isinstance(ask, dict) and ask.get("labels") is True


@dataclass
class ReadoutRecorder:
    """Encodes each forward's residual at the SAE's layer and keeps the top_k per position."""

    spec: ReadoutSpec
    steering: Steering
    tokenizer: Any = None  # decodes the positions' texts when the ask has token_text
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
        texts: list[str] = []
        if self.spec.token_text and selected:
            assert self.tokenizer is not None, "a read-out with token_text needs the engine's tokenizer"
            texts = token_texts(self.tokenizer, token_ids[:selected[-1] + 1])
        positions = []
        for p in selected:
            feats = [{"index": int(i), "value": round(float(v), 6)}
                     for v, i in zip(values[p].tolist(), indices[p].tolist()) if keep_zeros or v > 0]
            text = {"token": texts[p]} if self.spec.token_text else {}
            positions.append({"position": p, "token_id": token_ids[p], **text, "features": feats})
        return {"sae_id": self.spec.sae_id, "layer": self.spec.layer, "read_point": self.spec.read_point,
                "positions": positions, "note": NOTES[self.spec.read_point]}
