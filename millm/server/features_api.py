"""What a feature's decoder direction says, for the console's feature pages (``GET
/api/saes/{id}/features/{index}/directions``): the tokens it promotes and suppresses through the loaded model's
unembedding with their logit values, and its nearest features by decoder cosine among the SAEs and vector sets
attached at its layer (``millm.sae.directions``); and its activations over a corpus every install ships, as a
histogram (``GET .../histogram``, ``millm.sae.corpus_histogram``). The card itself is ``GET
/api/saes/{id}/features/{index}``. And features named as ``--steer`` names them (``POST /api/saes/{id}/resolve``),
so the console and the TUI over ``--url`` resolve, recommend and refuse by the CLI's one rule, not a copy."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from quart import Blueprint, request

from millm.errors import InvalidParameter
from millm.requests.validation import check_int
from millm.sae.cards import parse_index
from millm.sae.corpus_histogram import Histograms, corpus_histograms
from millm.sae.directions import extremes, nearest
from millm.sae.formats import load_sae
from millm.server.api import body, engine, use_names
from millm.server.state import services

bp = Blueprint("features_api", __name__, url_prefix="/api/saes")
use_names(bp)

MOST = 50  # tokens or neighbours one answer lists at most
NAMED = 256  # names or steer items one resolve takes at most
KEPT = 4  # SAEs whose corpus histograms are kept (each: d_sae x 24 counts)
_histograms: dict[tuple[str, str, str, int], Histograms] = {}


def layer_of(own: Any, record: dict[str, Any]) -> int | None:
    """The layer a feature is read at: where its SAE is attached (``own``), else the SAE's layer hint."""
    return own.layer if own is not None else record.get("layer_hint")


async def sae_of(own: Any, record: dict[str, Any]) -> Any:
    """The SAE itself: the attached one (``own``), else read from its files (off the event loop)."""
    return own.sae if own is not None else (await asyncio.to_thread(load_sae, Path(record["path"]))).sae


@bp.get("/<sae_id>/features/<index>/directions")
async def feature_directions(sae_id: str, index: str) -> Any:
    """A feature's direction: ``promotes`` and ``suppresses`` (?k= tokens each, default 10: the highest and lowest
    logits of its decoder row through the output embedding, no final norm, with their values) and ``nearest``
    (?k= features by decoder cosine, itself left out, among the SAEs and vector sets attached at its layer: where
    it is attached, else its layer hint, with itself compared whether attached or not). Needs a loaded
    transformers model (503 without one, 400 on llama.cpp)."""
    svc = services()
    record = svc.steering.sae(sae_id)
    feature = parse_index(index, int(record["d_sae"]), sae_id)
    raw = request.args.get("k", "10")
    k = check_int("k", int(raw) if raw.isdigit() else raw, low=1, high=MOST)
    target = engine()
    attachments = target.steering.attachments
    own = attachments.get(sae_id)
    weights = (await sae_of(own, record)).W_dec
    layer = layer_of(own, record)
    direction = weights[feature].detach().float().cpu()
    model = svc.manager.engine
    assert model is not None
    logits = await svc.worker.call(model.unembed, direction)
    up, down = extremes(logits, k)
    decoders = {a.sae_id: a.sae.W_dec.detach().cpu() for a in attachments.values() if a.layer == layer}
    decoders[sae_id] = weights.detach().cpu()
    found = await asyncio.to_thread(nearest, direction, decoders, k, (sae_id, feature))

    def label(sae: str, i: int) -> str:
        return svc.steering.store.label(sae, i) or ""

    def tokens(pairs: list[tuple[int, float]]) -> list[dict[str, Any]]:
        return [{"id": t, "token": model.token_text(t), "logit": round(v, 4)} for t, v in pairs]

    return {"sae": sae_id, "index": feature, "layer": layer, "norm": round(float(direction.norm()), 4),
            "promotes": tokens(up), "suppresses": tokens(down),
            "nearest": [{"sae": n.sae, "index": n.index, "cosine": n.cosine, "label": label(n.sae, n.index)}
                        for n in found]}


@bp.get("/<sae_id>/features/<index>/histogram")
async def feature_histogram(sae_id: str, index: str) -> Any:
    """A feature's activations over the shipped corpus (``millm.sae.corpus_histogram``): how many of its tokens
    it fires on and a histogram of its non-zero values. Read once per SAE, model and layer (the first call takes
    seconds), at the layer it is attached at, else its layer hint (400 without either). Needs a loaded
    transformers model (503 without one, 400 on llama.cpp)."""
    svc = services()
    record = svc.steering.sae(sae_id)
    feature = parse_index(index, int(record["d_sae"]), sae_id)
    own = engine().steering.attachments.get(sae_id)  # engine() refuses llama.cpp and no model
    layer = layer_of(own, record)
    if layer is None:
        raise InvalidParameter(f"'{sae_id}' names no layer to read: attach it at one first.", param="sae_id")
    model = svc.manager.engine
    assert model is not None
    key = (sae_id, str(record["path"]), model.fingerprint, int(layer))
    if key not in _histograms:
        sae = await sae_of(own, record)
        found = await svc.worker.call(corpus_histograms, model.model, model.tokenizer, sae, int(layer))  # type: ignore[attr-defined]
        while len(_histograms) >= KEPT:
            _histograms.pop(next(iter(_histograms)))
        _histograms[key] = found
    return {"sae": sae_id, "index": feature, "layer": int(layer), **_histograms[key].of(feature)}


def named(data: dict[str, Any], field: str) -> list[str]:
    """``data[field]``: 1 to ``NAMED`` non-blank strings, or a 400 naming the field."""
    items = data[field]
    if not 1 <= len(items) <= NAMED or not all(item.strip() for item in items):
        raise InvalidParameter(f"'{field}' must hold 1 to {NAMED} non-blank items, got {len(items)}.", param=field)
    return list(items)


@bp.post("/<sae_id>/resolve")
async def resolve_names(sae_id: str) -> Any:
    """Features named as ``--steer`` names them (``millm.sae.labels.LabelIndex``), exactly one of:
    ``{"names": [...]}``: each name's feature (an index, or the label search's one best match), as
    ``{"features": [{"name", "index", "label"}]}``; ``{"steer": ["weather", "9=-15"]}``: the values they set, a
    name alone at its recommended strength, as ``{"values": {index: strength}, "said": [...]}`` (``said`` names
    each recommended strength taken). A name that matches none or several, or (alone in ``steer``) one with no
    recommended strength, is a 400 naming the field, the best held-out point in its message."""
    data = await body()
    fields = [f for f in ("names", "steer") if f in data]
    if len(fields) != 1:
        raise InvalidParameter("Give exactly one of 'names' (features to find) and 'steer' (FEATURE[=STRENGTH] "
                               "items to resolve into values).", param="names")
    items = named(data, fields[0])
    index = await asyncio.to_thread(services().steering.label_index, sae_id)
    if fields[0] == "names":
        found = [(name, index.resolve(name, "names")) for name in items]
        return {"sae": sae_id, "features": [{"name": name, "index": i, "label": index.labels.get(i)}
                                            for name, i in found]}
    said: list[str] = []
    values = index.resolve_assignments(items, "steer", said.append)
    return {"sae": sae_id, "values": {str(i): v for i, v in values.items()}, "said": said}
