"""The OpenAI-compatible /v1 routes."""

from __future__ import annotations

import base64
import logging
import struct
from collections.abc import AsyncIterator
from typing import Any

from quart import Blueprint, Response, request

from millm.engine import Engine
from millm.engine.events import Activations, Delta, Event, Finish, Usage
from millm.engine.params import ChatPrompt, GenerationRequest, SamplingParams, TextPrompt
from millm.errors import (InvalidParameter, MillmError, ModelNotFound, ResponseFormatUnsupported, Unauthorized,
                          UnusedFieldsRefused)
from millm.fields import check_fields
from millm.registry import ModelEntry
from millm.steering.controller import Override
from millm.structured.schema import JsonConstraint, check_response_format
from millm.server import scoring, sse
from millm.server.headers import STRICT_HEADER, ignored_fields, seed_header, strict_mode
from millm.server.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, parse
from millm.server.shapes import CompletionShape
from millm.server.state import services
from millm.validation import check_messages, check_prompt_text, sampling_params

log = logging.getLogger(__name__)
bp = Blueprint("v1", __name__, url_prefix="/v1")


@bp.before_request
async def require_key() -> None:
    key = services().settings.api_key
    if key and request.headers.get("Authorization", "") != f"Bearer {key}":
        raise Unauthorized("A valid API key is required: send 'Authorization: Bearer <MILLM_API_KEY>'.")


async def json_body() -> Any:
    body = await request.get_json(force=True, silent=True)
    if body is None:
        raise InvalidParameter("The request body is not valid JSON.")
    return body


async def begin(route: str, schema: type[Any]) -> tuple[dict[str, Any], Any, ModelEntry, list[str]]:
    """What every /v1 request does first: parse, find the model, sort its fields (all before any load)."""
    body = await json_body()
    wire = parse(schema, body)
    entry = services().manager.entry(wire.model)
    return body, wire, entry, unused_fields(route, entry, body)


def unused_fields(route: str, entry: ModelEntry, body: dict[str, Any]) -> list[str]:
    """Refuse unhonourable fields; in strict mode refuse unused ones too; otherwise log and return them."""
    strict = strict_mode(request.headers.get(STRICT_HEADER))
    locations = check_fields(route, entry.engine, body)
    if locations and strict:
        raise UnusedFieldsRefused(f"{STRICT_HEADER} is set and these fields are not used: {', '.join(locations)}.",
                                  param=locations[0])
    if locations:
        log.warning("request_fields_unused locations=%s", locations)
    return locations


def miLLM_headers(ignored: list[str], seed: int | None = None, scope: str = "request",
                  steering: str = "none") -> dict[str, str]:
    headers = {"X-miLLM-Ignored-Fields": ignored_fields(ignored), "X-miLLM-Seed": seed_header(seed, scope),
               "X-miLLM-Steering": steering}
    return {k: v for k, v in headers.items() if v is not None}


def steering_label(engine: Engine, override: Override | None = None) -> str:
    """X-miLLM-Steering for a response from ``engine`` (llama.cpp is never steered)."""
    return engine.steering.label(override) if engine.steering is not None else "none"


async def sse_events(shape: CompletionShape, events: AsyncIterator[Event], choices: int) -> AsyncIterator[str]:
    """Stream frames: role openers (chat), deltas, finishes (the last one with usage), then [DONE]."""
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
                yield sse.data(shape.chunk(held.index, finish=held.reason, usage=event))
        if readout is not None:
            yield sse.data(shape.extension({"sae_activations": readout.body}))
    except MillmError as exc:
        yield sse.error(exc.body())
    except Exception as exc:  # the status is already 200: report in-stream, never drop the stream silently
        log.exception("generation failed mid-stream")
        yield sse.error(MillmError(f"Generation failed: {exc}").body())
    yield sse.DONE


async def collect(shape: CompletionShape, events: AsyncIterator[Event]) -> dict[str, Any]:
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    extension: dict[str, Any] = {}
    async for event in events:
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


async def respond(shape: CompletionShape, events: AsyncIterator[Event], stream: bool, choices: int,
                  headers: dict[str, str]) -> Response | tuple[dict[str, Any], int, dict[str, str]]:
    if stream:
        response = Response(sse_events(shape, events, choices), mimetype="text/event-stream",
                            headers={**headers, "Cache-Control": "no-cache"})
        response.timeout = None
        return response
    return await collect(shape, events), 200, headers


def constraint_for(body: dict[str, Any], params: SamplingParams) -> JsonConstraint | None:
    """response_format checked before anything loads, with the combinations it cannot live with."""
    constraint = check_response_format(body.get("response_format"))
    if constraint is not None:
        if body.get("stream"):
            raise ResponseFormatUnsupported("'response_format' cannot be streamed: a partial document would be "
                                            "reported before it validates.", param="response_format")
        if params.stop:
            raise ResponseFormatUnsupported("'response_format' cannot be combined with 'stop': a stop string "
                                            "could cut a document and report it complete.", param="response_format")
    return constraint


@bp.post("/chat/completions")
async def chat_completions() -> Any:
    """Chat completion, streaming or not; extra_messages answers further conversations as further choices."""
    body, wire, entry, ignored = await begin("chat", ChatCompletionRequest)
    svc = services()
    conversations = [check_messages(wire.messages)]
    conversations += [check_messages(c, f"extra_messages[{k}]") for k, c in enumerate(wire.extra_messages or [])]
    if scoring.is_chat_scoring(body):
        return await score_chat(body, entry, conversations, ignored)
    params = sampling_params(body)
    if wire.stream and params.n > 1:
        raise InvalidParameter("'n' above 1 cannot be streamed; send stream: false or n: 1.", param="n")
    constraint = constraint_for(body, params)
    template_kwargs = wire.chat_template_kwargs or {}
    if wire.profile is not None:
        svc.steering.profile(wire.profile)  # 404 before any load
    engine = await svc.manager.engine_for(entry)
    override = svc.steering.override_for(engine, wire.profile) if wire.profile is not None else None
    generation = GenerationRequest([ChatPrompt(m, template_kwargs) for m in conversations], params,
                                   override=override, readout=wire.return_sae_activations, constraint=constraint)
    plan = engine.prepare(generation)
    scope = "batch-shape" if len(conversations) > 1 else "request"
    headers = miLLM_headers(ignored, params.seed, scope, steering_label(engine, override))
    if constraint is not None:
        headers["X-miLLM-Constrained"] = constraint.header()
    events = svc.worker.stream(lambda cancel: engine.run(plan, cancel))
    shape = CompletionShape(chat=True, model=entry.id, fingerprint=engine.fingerprint)
    return await respond(shape, events, bool(wire.stream), len(conversations) * params.n, headers)


@bp.post("/completions")
async def completions() -> Any:
    """Text completion: the prompt goes to the model verbatim; each prompt of a list is its own choice."""
    body, wire, entry, ignored = await begin("completions", CompletionRequest)
    svc = services()
    prompts = [wire.prompt] if isinstance(wire.prompt, str) else wire.prompt
    if not prompts:
        raise InvalidParameter("'prompt' is an empty list.", param="prompt")
    special = body.get("add_special_tokens", True)
    if not isinstance(special, bool):
        raise InvalidParameter("'add_special_tokens' must be true or false.", param="add_special_tokens")
    if scoring.is_completion_scoring(body):
        return await score_completions(body, entry, prompts, special, ignored)
    for i, text in enumerate(prompts):
        check_prompt_text("prompt" if isinstance(wire.prompt, str) else f"prompt[{i}]", text)
    if body.get("return_tokens_as_token_ids") is not None:
        ignored.append("return_tokens_as_token_ids")  # only scoring returns tokens
    params = sampling_params(body)
    engine = await svc.manager.engine_for(entry)
    readout = wire.return_sae_activations
    if readout is not None and len(prompts) > 1:
        engine.prepare(GenerationRequest([TextPrompt(p, special) for p in prompts], params, readout=readout))
    plans = [engine.prepare(GenerationRequest([TextPrompt(p, special)], params, readout=readout)) for p in prompts]
    events = svc.worker.stream(lambda cancel: engine.run_each(plans, cancel))
    shape = CompletionShape(chat=False, model=entry.id, fingerprint=engine.fingerprint)
    return await respond(shape, events, bool(wire.stream), len(prompts),
                         miLLM_headers(ignored, params.seed, steering=steering_label(engine)))


def scoring_headers(ignored: list[str], body: dict[str, Any]) -> dict[str, str]:
    seed = body.get("seed")
    if seed is not None:
        sampling_params({"seed": seed})  # accepted and echoed; it changes nothing here
    return miLLM_headers(ignored + scoring.unused(body), seed)  # never steered: X-miLLM-Steering none


async def score_completions(body: dict[str, Any], entry: ModelEntry, prompts: list[str], special: bool,
                            ignored: list[str]) -> Any:
    """Next-token log-probabilities for each prompt, in padded batches. Never steered or monitored."""
    svc = services()
    scoring.check_request(body)
    engine = await svc.manager.engine_for(entry)
    params = scoring.completion_params(body, len(engine.tokenizer))
    prompt_ids = [engine.tokenizer(p, add_special_tokens=special)["input_ids"] for p in prompts]
    results = await svc.worker.call(scoring.score_batch, engine, prompt_ids, params)
    shape = CompletionShape(chat=False, model=entry.id, fingerprint=engine.fingerprint)
    return (scoring.completion_body(shape, engine, prompts, prompt_ids, results, params), 200,
            scoring_headers(ignored, body))


async def score_chat(body: dict[str, Any], entry: ModelEntry, conversations: list[Any], ignored: list[str]) -> Any:
    """Chat scoring: the template with its generation prompt, scored like a completion; one choice per
    conversation, each scored on its own."""
    svc = services()
    scoring.check_request(body)
    engine = await svc.manager.engine_for(entry)
    params = scoring.chat_params(body, len(engine.tokenizer))
    prompt_ids = scoring.chat_prompt_ids(engine, conversations)
    results = await svc.worker.call(scoring.score_each, engine, prompt_ids, params)
    shape = CompletionShape(chat=True, model=entry.id, fingerprint=engine.fingerprint)
    return scoring.chat_body(shape, engine, prompt_ids, results, params), 200, scoring_headers(ignored, body)


@bp.post("/embeddings")
async def embeddings() -> Any:
    """Mean-pooled last-hidden-layer embeddings, never steered."""
    body, wire, entry, ignored = await begin("embeddings", EmbeddingRequest)
    svc = services()
    encoding = wire.encoding_format or "float"
    if encoding not in ("float", "base64"):
        raise InvalidParameter(f"'encoding_format' must be float or base64, got {encoding!r}.", param="encoding_format")
    raw = wire.input
    if isinstance(raw, str) or (raw and all(isinstance(t, int) for t in raw)):
        inputs: list[Any] = [raw]
    else:
        inputs = list(raw)
    if not inputs:
        raise InvalidParameter("'input' is an empty list.", param="input")
    engine = await svc.manager.engine_for(entry)
    vectors, tokens = await svc.worker.call(engine.embed, inputs)
    data = []
    for i, vector in enumerate(vectors):
        value: Any = vector
        if encoding == "base64":
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": i, "embedding": value})
    body_out = {"object": "list", "data": data, "model": entry.id,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return body_out, 200, miLLM_headers(ignored)  # X-miLLM-Steering: none, always


def model_card(entry: ModelEntry) -> dict[str, Any]:
    return {"id": entry.id, "object": "model", "created": int(entry.path.stat().st_mtime), "owned_by": "millm"}


@bp.get("/models")
async def models() -> Any:
    """Models this server can serve: loaded, loading and ready on disk."""
    return {"object": "list", "data": [model_card(e) for e in services().manager.entries()]}


@bp.get("/models/<path:model_id>")
async def model(model_id: str) -> Any:
    """One model's card."""
    for entry in services().manager.entries():
        if entry.id == model_id:
            return model_card(entry)
    raise ModelNotFound(model_id)
