"""The OpenAI-compatible /v1 routes: parse -> build -> engine -> render."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from typing import Any

from quart import Blueprint, Response, request

from millm.builder import STRICT_HEADER, Built, build_chat, build_completion, build_embedding, refuse_under_batching
from millm.engine.base import Engine, StepControl
from millm.engine.events import Event
from millm.engine.plan import run_each
from millm.errors import FieldNotHonoured, ModelNotFound
from millm.limits import Limits, check_prompt_tokens, prompt_tokens
from millm.registry import ModelEntry
from millm.render import scoring
from millm.render.bodies import embeddings_body, score_body, whole_body
from millm.render.headers import miLLM_headers
from millm.render.shapes import CompletionShape
from millm.render.stream import sse_events
from millm.server import metrics
from millm.server.auth import require_api_key
from millm.server.bodies import read_json
from millm.server.headers import strict_mode
from millm.server.state import services
from millm.steering.bases import RequestSteering

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


async def collect(shape: CompletionShape, events: AsyncIterator[Event]) -> dict[str, Any]:
    return whole_body(shape, [event async for event in events])


async def respond(shape: CompletionShape, events: AsyncIterator[Event], built: Built,
                  headers: dict[str, str]) -> Response | tuple[dict[str, Any], int, dict[str, str]]:
    shape.constraint = built.constraint  # a tool-call constraint's text renders as content and tool_calls
    if built.stream:
        response = Response(sse_events(shape, events, built.choices, built.include_usage), mimetype="text/event-stream",
                            headers={**headers, "Cache-Control": "no-cache"})
        response.timeout = None
        return response
    return await collect(shape, events), 200, headers


async def request_steering(engine: Engine, built: Built) -> RequestSteering:
    """The request's own steering from ``profile`` and ``steering_intensity`` (validated against what is
    attached), and what its headers say. Resolved on the engine thread, between decode steps, so it sees
    the attachments as operator commands leave them."""
    svc = services()
    target = engine.steering_target()
    if target is None:
        refuse_unsteerable(engine, built)
        return RequestSteering()
    return await svc.worker.command(svc.steering.for_request, target, built.profile, built.intensity)


def refuse_unsteerable(engine: Engine, built: Built) -> None:
    """``profile`` or ``steering_intensity`` on an engine that cannot steer: refused, naming the field."""
    for name, value in (("profile", built.profile), ("steering_intensity", built.intensity)):
        if value is not None:
            raise FieldNotHonoured(f"'{name}' cannot be honoured by the {engine.engine_name} engine.", param=name)


async def generate(built: Built, entry: ModelEntry, chat: bool) -> Any:
    """Generation: each prepared plan run in turn on the engine thread, streamed or collected."""
    svc = services()
    if svc.worker.batching is not None:
        refuse_under_batching(built)
    if built.profile is not None:
        svc.steering.profile(built.profile)  # 404 before any load
    engine = await svc.manager.engine_for(entry)
    steer = await request_steering(engine, built)
    # tokenising and template rendering: on the engine thread (it owns the tokenizer), never the event loop
    plans = await svc.worker.call(lambda: [engine.prepare(replace(g, override=steer.override))
                                           for g in built.generations])
    check_prompt_tokens("messages" if chat else "prompt", prompt_tokens(plans), Limits.of(svc.settings))
    target = engine.steering_target()
    label = target.steering.label(steer.override) if target is not None else "none"

    check = (lambda: steer.check(target.steering)) if target is not None and steer.pinned else None

    def make_events(control: StepControl) -> Iterator[Event]:
        return run_each(engine.run, plans, control if check is None else control.checking(check))

    events = metrics.observed(await svc.worker.generate(engine, plans, make_events, check))
    shape = CompletionShape(chat=chat, model=built.model, fingerprint=engine.fingerprint)
    return await respond(shape, events, built, miLLM_headers(built, label, steer))


async def score(built: Built, entry: ModelEntry, chat: bool) -> Any:
    """Next-token log-probabilities; never steered or monitored (X-miLLM-Steering: none)."""
    svc = services()
    assert built.score is not None
    engine = await svc.manager.engine_for(entry)
    results, readout = await svc.worker.call(scoring.score_reading, engine, built.score, built.readout)
    shape = CompletionShape(chat=chat, model=built.model, fingerprint=engine.fingerprint)
    return score_body(shape, engine, built, results, readout), 200, miLLM_headers(built)


@bp.post("/chat/completions")
async def chat_completions() -> Any:
    """Chat completion, streaming or not; extra_messages answers further conversations as further choices."""
    built, entry = await begin(build_chat)
    return await (score if built.score is not None else generate)(built, entry, chat=True)


@bp.post("/completions")
async def completions() -> Any:
    """Text completion: the prompt goes to the model verbatim; each prompt of a list is its own choice."""
    built, entry = await begin(build_completion)
    return await (score if built.score is not None else generate)(built, entry, chat=False)


@bp.post("/embeddings")
async def embeddings() -> Any:
    """Mean-pooled last-hidden-layer embeddings, never steered."""
    built, entry = await begin(build_embedding)
    svc = services()
    engine = await svc.manager.engine_for(entry)
    vectors, tokens = await svc.worker.call(engine.embed, built.embed_inputs)
    return embeddings_body(built, vectors, tokens), 200, miLLM_headers(built)  # X-miLLM-Steering: none, always


def model_card(entry: ModelEntry) -> dict[str, Any]:
    return {"id": entry.id, "object": "model", "created": int(entry.path.stat().st_mtime),
            "owned_by": entry.repo_id or "millm"}


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
