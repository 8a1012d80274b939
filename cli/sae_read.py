"""``millm sae read``: which features of an SAE fire on each token of a text.

The text is read as a scoring read-out is (``return_sae_activations`` on a scoring request): one unsteered
forward pass, every SAE's steering suppressed, built and checked by the server's request builder. The SAE
is attached for the read only, when it was not attached already, and taken off afterwards.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from cli.common import engine_for, out, read_stdin, reports_errors, sae_ref, steerable, steering_service
from millm.errors import InvalidParameter

if TYPE_CHECKING:
    from millm.engine.base import Engine
    from millm.steering.service import SteeringService
    from millm.steering.target import SteeringTarget

DEFAULT_TOP_K = 5


def feature_indices(items: list[str], labels: dict[int, str], name: str) -> list[int]:
    """``--features`` values: an index, comma-separated indices, or a label (``millm.sae.labels``' one naming
    rule; a label may hold commas itself)."""
    from millm.sae.cards import index_of
    from millm.sae.labels import LabelIndex

    index = LabelIndex(labels, name)
    found: list[int] = []
    for item in items:
        parts = [index_of(part) for part in item.split(",")]
        found += [p for p in parts if p is not None] if None not in parts else [index.resolve(item, "features")]
    return found


def attached_for_read(service: SteeringService, target: SteeringTarget, sae_id: str,
                      layer: int | None) -> AbstractContextManager[object]:
    """The SAE attached for the read: as it is when already attached, else for the read only (``millm chat
    --sae``'s session, which detaches it afterwards)."""
    from millm.steering.session import chat_steering

    att = target.steering.attachments.get(sae_id)
    if att is None:
        return chat_steering(service, target, sae_id, layer, {}, None)
    if layer is not None and layer != att.layer:
        raise InvalidParameter(f"SAE {sae_id} is attached at layer {att.layer}; detach it to read at layer {layer}, "
                               "or leave --layer out.", param="layer")
    return nullcontext()


def read_text(engine: Engine, service: SteeringService, sae_id: str, text: str, *, top_k: int,
              features: list[int] | None = None, layer: int | None = None) -> dict[str, Any]:
    """The read-out of ``text`` (every prompt position, its token text and each feature's registry label)."""
    from millm.requests.builder import build_completion
    from millm.steering.readout import with_labels

    ask: dict[str, Any] = {"sae_id": sae_id, "positions": "prompt", "top_k": top_k, "token_text": True}
    if features:
        ask["features"] = features
    body = {"model": engine.model_id, "prompt": text, "max_tokens": 1, "logprobs": 0, "return_sae_activations": ask}
    built = build_completion(body, lambda _: engine.engine_name)
    assert built.score is not None
    target = steerable(engine)
    with attached_for_read(service, target, sae_id, layer):
        readout = engine.score(built.score)[0].readout
    assert readout is not None
    return with_labels(readout, service.store.label_map(sae_id))


def _shown(token: str) -> str:
    """A token as the table shows it: quoted, with whitespace and control characters escaped."""
    return json.dumps(token, ensure_ascii=False)


def _cell(features: list[dict[str, Any]], key: str, fmt: Any = str) -> Text:
    """One column of a token's features, a line each (plain text: labels are never read as markup)."""
    return Text("\n".join(fmt(f[key]) if f[key] is not None else "-" for f in features) or "-")


def table_of(readout: dict[str, Any]) -> Table:
    """A row per token: its position and text, and its features (index, value, label), largest first."""
    table = Table("pos", "token", "feature", "value", "label",
                  title=f"{readout['sae_id']} at layer {readout['layer']}, {readout['read_point']}")
    for p in readout["positions"]:
        feats = p["features"]
        table.add_row(str(p["position"]), Text(_shown(p["token"])), _cell(feats, "index"),
                      _cell(feats, "value", lambda v: f"{v:.3f}"), _cell(feats, "label"))
    return table


def read(
    sae: Annotated[str, typer.Argument(help="SAE id or name (see `millm sae list`); bundled SAEs by their name.")],
    text: Annotated[str, typer.Argument(help="Text to read; - reads stdin.")],
    top_k: Annotated[int, typer.Option("--top-k", help="Features shown per token, largest first.")] = DEFAULT_TOP_K,
    features: Annotated[list[str] | None, typer.Option("--features", help="Only these features: an index, indices "
                                                       "as 12,99, or a label (repeatable).")] = None,
    model: Annotated[str | None, typer.Option(help="Model id (default: the configured one).")] = None,
    layer: Annotated[int | None, typer.Option(help="Layer to attach the SAE at for the read "
                                                   "(default: its layer hint).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the read-out as JSON instead of a table.")] = False,
) -> None:
    """Show, token by token, which features of SAE fire on TEXT (unsteered, as a scoring read-out)."""
    if text == "-":
        text = read_stdin("text")
    service = steering_service()
    sae_id = sae_ref(sae)
    wanted = None
    if features:

        wanted = feature_indices(features, service.store.label_map(sae_id), sae)
    engine = engine_for(model)
    readout = read_text(engine, service, sae_id, text, top_k=top_k, features=wanted, layer=layer)
    if as_json:
        out.print(json.dumps({"model": engine.model_id, "text": text, **readout}, ensure_ascii=False), markup=False)
    else:
        out.print(table_of(readout))


def register(sae_app: typer.Typer) -> None:
    """Add ``read`` to ``millm sae``."""
    sae_app.command("read")(reports_errors(read))
