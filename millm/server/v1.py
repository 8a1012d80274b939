"""The OpenAI-compatible /v1 routes: parse -> build -> engine -> render."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from quart import Blueprint, Response, request

from millm.engine.base import Engine
from millm.engine.events import Event, Steered
from millm.errors import ModelNotFound
from millm.probes.serving import loaded as loaded_probes
from millm.probes.serving import with_probes
from millm.registry import ModelEntry
from millm.render.bodies import embeddings_body, score_body, whole_body
from millm.render.headers import miLLM_headers, prepared_headers, probes_headers
from millm.render.shapes import CompletionShape
from millm.render.stream import sse_events
from millm.requests.builder import (
    STRICT_HEADER,
    Built,
    build_chat,
    build_completion,
    build_embedding,
    refuse_under_batching,
)
from millm.requests.generation import Prepared, prepare
from millm.requests.limits import Limits
from millm.server import metrics
from millm.server.auth import require_api_key
from millm.server.bodies import read_json
from millm.server.headers import strict_mode
from millm.server.sensing import sensed
from millm.server.state import services
from millm.steering.readout import LabelSource, asks_labels

bp = Blueprint("v1", __name__, url_prefix="/v1")


@bp.before_request
async def require_key() -> None:
    require_api_key(services().settings, request.headers.get("Authorization", ""))


async def json_body() -> Any:
    return await read_json()


async def begin(build: Callable[..., Built]) -> tuple[Built, ModelEntry]:
    """Parse the body and decide every field, before any model is loaded; the model's registry entry."""
    manager = services().manager
    strict = strict_mode(request.headers.get(STRICT_HEADER))
    found: list[ModelEntry] = []

    def engine_of(name: str) -> str:
        found.append(manager.entry(name))
        return found[-1].engine

    body = await json_body()
    limits = Limits.of(services().settings)
    return await asyncio.to_thread(build, body, engine_of, strict, limits), found[-1]  # off the event loop


@asynccontextmanager
async def engine_held(entry: ModelEntry) -> AsyncIterator[Engine]:
    """The engine serving ``entry`` (loaded first if need be), held from the model check until the request's
    engine work is admitted to the worker, which counts it from then on: an unload beginning in between
    waits for it instead of closing the engine under it."""
    svc = services()
    engine = await svc.manager.engine_for(entry)
    release = svc.worker.lease()  # no await since engine_for's last check: an unload cannot begin in between
    try:
        yield engine
    finally:
        release()


async def opened(events: AsyncIterator[Event]) -> tuple[str | None, AsyncIterator[Event]]:
    """The steering label a generation's events open with (the engine's ``Steered``, sent when its rows are
    bound; None from an engine that sends none), and the rest of its events. Waiting for it means a request
    that fails before it starts (cancelled by an unload, its steering invalid while it queued) is answered
    with its error's own status, streamed or not."""
    stream = events.__aiter__()
    try:
        first = await stream.__anext__()
    except StopAsyncIteration:
        return None, stream
    if isinstance(first, Steered):
        return first.label, stream
    return None, _prepend(first, stream)


async def _prepend(first: Event, rest: AsyncIterator[Event]) -> AsyncIterator[Event]:
    yield first
    async for event in rest:
        yield event


async def respond(shape: CompletionShape, events: AsyncIterator[Event], built: Built,
                  prepared: Prepared) -> Response | tuple[dict[str, Any], int, dict[str, str]]:
    """The response, its headers saying what steered the request when its rows were bound."""
    label, events = await opened(events)
    headers = prepared_headers(prepared, built, label)
    if built.stream:
        response = Response(sse_events(shape, events, built.choices, built.include_usage), mimetype="text/event-stream",
                            headers={**headers, "Cache-Control": "no-cache"})
        response.timeout = None
        return response
    collected = [event async for event in events]
    return whole_body(shape, collected), 200, {**headers, **probes_headers(collected)}


async def generate(built: Built, entry: ModelEntry) -> Any:
    """Generation: prepared on the engine thread (steering, tokens, limits), then run by the engine's
    scheduler, streamed or collected."""
    svc = services()
    if svc.worker.batching is not None and svc.worker.batching.constraints == "refuse":
        refuse_under_batching(built)
    if built.profile is not None:
        svc.steering.profile(built.profile)  # 404 before any load
    probes = await asyncio.to_thread(loaded_probes, svc.settings.home, built.probes)
    async with engine_held(entry) as engine:
        prepared = await svc.worker.call(lambda: prepare(engine, with_probes(engine, built, svc.steering, probes),
                                                         Limits.of(svc.settings), svc.steering))
        events = metrics.observed(await svc.worker.generate(engine, prepared.plans, prepared.check))
    spec = next((plan.readout for plan in prepared.plans if plan.readout is not None), None)
    labels = await read_labels(spec.sae_id if spec is not None and spec.labels else None)
    shape = CompletionShape.of(built, engine.fingerprint, labels)
    return await respond(shape, sensed(events, shape.id), built, prepared)


async def read_labels(sae_id: str | None) -> LabelSource | None:
    """The registry's labels of the read-out's SAE (None: no labels asked), read in a thread: SQLite stays off
    the event loop."""
    if sae_id is None:
        return None
    labels = await asyncio.to_thread(services().steering.store.label_map, sae_id)
    return lambda _: labels


async def score(built: Built, entry: ModelEntry) -> Any:
    """Next-token log-probabilities; never steered or monitored (X-miLLM-Steering: none)."""
    svc = services()
    assert built.score is not None
    async with engine_held(entry) as engine:
        results = await svc.worker.call(engine.score, built.score)
    readout = results[0].readout
    labels = await read_labels(readout["sae_id"] if readout is not None and asks_labels(built.score.readout) else None)
    shape = CompletionShape.of(built, engine.fingerprint, labels)
    return score_body(shape, engine, built, results), 200, miLLM_headers(built)


@bp.post("/chat/completions")
async def chat_completions() -> Any:
    """Chat completion, streaming or not; extra_messages answers further conversations as further choices."""
    built, entry = await begin(build_chat)
    return await (score if built.score is not None else generate)(built, entry)


@bp.post("/completions")
async def completions() -> Any:
    """Text completion: the prompt goes to the model verbatim; each prompt of a list is its own choice."""
    built, entry = await begin(build_completion)
    return await (score if built.score is not None else generate)(built, entry)


@bp.post("/embeddings")
async def embeddings() -> Any:
    """Mean-pooled last-hidden-layer embeddings, never steered."""
    built, entry = await begin(build_embedding)
    svc = services()
    async with engine_held(entry) as engine:
        vectors, tokens = await svc.worker.call(engine.embed, built.embed_inputs)
    return embeddings_body(built, vectors, tokens), 200, miLLM_headers(built)  # X-miLLM-Steering: none, always


def model_card(entry: ModelEntry) -> dict[str, Any]:
    """OpenAI's model object; the loaded model's also carries its ``system_fingerprint`` (dtype, int8 weights,
    quantization, engine), as its completions do."""
    card: dict[str, Any] = {"id": entry.id, "object": "model", "created": int(entry.path.stat().st_mtime),
                            "owned_by": entry.repo_id or "millm"}
    engine = services().manager.engine
    if engine is not None and engine.model_id == entry.id:
        card["system_fingerprint"] = engine.fingerprint
    return card


@bp.get("/models")
async def models() -> Any:
    """Models this server serves: loaded, loading and ready on disk (only the locked one while locked)."""
    return {"object": "list", "data": [model_card(e) for e in services().manager.served()]}


@bp.get("/models/<path:model_id>")
async def model(model_id: str) -> Any:
    """One model's card: the name resolves as on every other route (a bare GGUF repo name too)."""
    manager = services().manager
    named = manager.named(model_id)
    for entry in manager.served():
        if entry.id == named.id:
            return model_card(entry)
    raise ModelNotFound(model_id)
