"""The OpenAI-compatible /v1 routes: parse -> build -> engine -> render."""

from __future__ import annotations

import asyncio
import base64
import logging
import struct
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any

from quart import Blueprint, Response, request

from millm.builder import STRICT_HEADER, Built, build_chat, build_completion, build_embedding, refuse_under_batching
from millm.engine.base import Engine, StepControl
from millm.engine.events import Activations, Delta, Event, Finish, Usage
from millm.engine.plan import run_each
from millm.engine.scoring import ScoreResult
from millm.errors import FieldNotHonoured, MillmError, ModelNotFound
from millm.limits import Limits, check_prompt_tokens, prompt_tokens
from millm.registry import ModelEntry
from millm.server import metrics, scoring, sse
from millm.server.auth import require_api_key
from millm.server.bodies import read_json
from millm.server.headers import ignored_fields, seed_header, strict_mode
from millm.server.shapes import CompletionShape
from millm.server.state import services
from millm.steering.bases import RequestSteering
from millm.steering.names import steering_header
from millm.steering.rung import CIRCUIT_RUNG_HEADER, rung_header

log = logging.getLogger(__name__)
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


INTENSITY_HEADER = "X-miLLM-Steering-Intensity"


def miLLM_headers(built: Built, steering: str = "none", steer: RequestSteering | None = None) -> dict[str, str]:
    headers = {"X-miLLM-Ignored-Fields": ignored_fields(built.ignored),
               "X-miLLM-Seed": seed_header(built.seed, built.seed_scope), "X-miLLM-Steering": steering_header(steering)}
    if steer is not None:
        headers[INTENSITY_HEADER] = steer.echo
        headers[CIRCUIT_RUNG_HEADER] = rung_header(steer.rung) if steer.rung is not None else None
    if built.constraint is not None:
        headers["X-miLLM-Constrained"] = built.constraint.header()
    return {k: v for k, v in headers.items() if v is not None}


async def sse_events(shape: CompletionShape, events: AsyncIterator[Event], choices: int,
                     include_usage: bool = True) -> AsyncIterator[str]:
    """Stream frames: role openers (chat), deltas, finishes (the last one with usage unless
    ``stream_options.include_usage`` is false), then [DONE]."""
    try:
        if shape.chat:
            for i in range(choices):
                yield sse.data(shape.chunk(i, role=True))
        held: Finish | None = None
        readout: Activations | None = None
        async for event in events:
            if isinstance(event, Delta):
                yield sse.data(shape.chunk(event.index, event.text))
            elif isinstance(event, Finish):
                if held is not None:
                    yield sse.data(shape.chunk(held.index, finish=held.reason))
                held = event
            elif isinstance(event, Activations):
                readout = event
            elif isinstance(event, Usage) and held is not None:
                yield sse.data(shape.chunk(held.index, finish=held.reason, usage=event if include_usage else None))
        if readout is not None:
            yield sse.data(shape.extension({"sae_activations": readout.body}))
    except MillmError as exc:
        yield sse.error(exc.body())
    except Exception as exc:  # the status is already 200: report in-stream, never drop the stream silently
        log.exception("generation failed mid-stream")
        yield sse.error(MillmError(f"Generation failed: {exc}").body())
    yield sse.DONE


async def collect(shape: CompletionShape, events: AsyncIterator[Event]) -> dict[str, Any]:
    return whole_body(shape, [event async for event in events])


def whole_body(shape: CompletionShape, events: Iterable[Event]) -> dict[str, Any]:
    """The non-streamed body of a generation's events (``millm batch`` renders its rows here too)."""
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    extension: dict[str, Any] = {}
    for event in events:
        if isinstance(event, Delta):
            texts[event.index] = texts.get(event.index, "") + event.text
        elif isinstance(event, Finish):
            finishes[event.index] = event.reason
        elif isinstance(event, Activations):
            extension["sae_activations"] = event.body
        elif isinstance(event, Usage):
            whole = shape.whole(texts, finishes, event)
            return {**whole, "millm": extension} if extension else whole
    raise MillmError("Generation ended without a result.")


async def respond(shape: CompletionShape, events: AsyncIterator[Event], built: Built,
                  headers: dict[str, str]) -> Response | tuple[dict[str, Any], int, dict[str, str]]:
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


def score_body(shape: CompletionShape, engine: Engine, built: Built, results: list[ScoreResult],
               readout: dict[str, Any] | None) -> dict[str, Any]:
    """A scoring response's body (``millm batch`` renders its rows here too)."""
    assert built.score is not None
    params = [row.params for row in built.score.rows]
    body = (scoring.chat_body(shape, engine, results, params) if shape.chat
            else scoring.completion_body(shape, engine, built.prompt_texts, results, params))
    if readout is not None:
        body["millm"] = {"sae_activations": readout}
    return body


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


def embeddings_body(built: Built, vectors: list[list[float]], tokens: int) -> dict[str, Any]:
    """An embeddings response's body (``millm batch`` renders its rows here too)."""
    data = []
    for i, vector in enumerate(vectors):
        value: Any = vector
        if built.encoding == "base64":
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": i, "embedding": value})
    return {"object": "list", "data": data, "model": built.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def model_card(entry: ModelEntry) -> dict[str, Any]:
    return {"id": entry.id, "object": "model", "created": int(entry.path.stat().st_mtime),
            "owned_by": entry.repo_id or "millm"}


@bp.get("/models")
async def models() -> Any:
    """Models this server serves: loaded, loading and ready on disk (only the locked one while locked)."""
    return {"object": "list", "data": [model_card(e) for e in services().manager.served()]}


@bp.get("/models/<path:model_id>")
async def model(model_id: str) -> Any:
    """One model's card."""
    for entry in services().manager.served():
        if entry.id == model_id:
            return model_card(entry)
    raise ModelNotFound(model_id)
