"""The one request builder: a /v1 body (or CLI options written as one) becomes a typed engine request.

Every field is decided in one pass before any model work: the wire shape is parsed, the request's
column of the field table is chosen (scoring requests have columns of their own), each field is used,
reported or refused (strict mode refuses the reported ones too), and every value is checked. The
server, the CLI and the TUI build requests here, so a rule is written once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from millm.engine.params import ChatPrompt, GenerationRequest, SamplingParams, TextPrompt, TokenPrompt
from millm.engine.scoring import (
    ScoreRequest,
    ScoreRow,
    ScoringParams,
    check_allowed,
    check_scoring_shape,
    check_top_n,
)
from millm.engine.templates import TOOLS_KWARG
from millm.errors import InvalidParameter, ResponseFormatUnsupported, UnusedFieldsRefused
from millm.probes.asks import Ask, parse_asks
from millm.requests.fields import NESTED_KEYS, TOOLS_REFUSED, check_fields, is_no_change, template_messages
from millm.requests.limits import Limits, check_embedding_inputs, check_prompt_tokens, check_prompts, check_rows
from millm.requests.validation import (
    check_messages,
    check_number,
    check_prompt_text,
    check_scoring_temperature,
    max_tokens_of,
    sampling_params,
)
from millm.requests.wire import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, parse
from millm.steering.intensity import Dial, parse_intensity
from millm.steering.readout import ReadoutAsk, check_readout, check_readout_rows
from millm.steering.scope import Scope, parse_scope
from millm.structured.schema import JsonConstraint, check_response_format
from millm.structured.tools import Constraint, ToolConstraint, check_tool_history, tool_constraint

log = logging.getLogger(__name__)

STRICT_HEADER = "X-miLLM-Strict"
ENCODINGS = ("float", "base64")


@dataclass(frozen=True)
class Built:
    """A request with every field decided: what to run, and what the response must say about it."""

    route: str  # "chat", "completions" or "embeddings"
    model: str
    ignored: list[str]
    stream: bool = False
    generations: list[GenerationRequest] = field(default_factory=list)  # run one after another
    score: ScoreRequest | None = None
    embed_inputs: list[Any] = field(default_factory=list)
    encoding: str = "float"
    profile: str | None = None
    intensity: Dial = None  # steering_intensity: a λ, "off"/"min"/"max", or None when not sent
    scope: Scope | None = None  # steering_scope, or None when not sent (the profile's, else "all")
    seed: int | None = None
    seed_scope: str = "request"
    prompt_texts: list[str | None] = field(default_factory=list)  # completions scoring: text (None: token ids)
    include_usage: bool = True  # stream_options.include_usage: usage on the final streamed chunk
    probes: tuple[Ask, ...] = ()  # the probes its ``probes`` field asks for (besides the attached ones)

    @property
    def choices(self) -> int:
        return sum(len(g.prompts) * g.params.n for g in self.generations)

    @property
    def constraint(self) -> Constraint | None:
        return self.generations[0].constraint if self.generations else None


EngineOf = Callable[[str], str]  # model name -> the engine that runs it ("transformers", "llama.cpp")


def decide_fields(route: str, engine: str, body: Mapping[str, Any], strict: bool, scoring: bool,
                  limits: Limits | None = None) -> list[str]:
    """Refuse what cannot be honoured (tools too, under MILLM_TOOLS=refuse); in strict mode refuse what is unused
    too; else log and return it."""
    overrides = TOOLS_REFUSED if limits is not None and limits.tools == "refuse" else None
    locations = check_fields(route, engine, body, scoring, overrides, limits is not None and limits.gguf_steering)
    if locations and strict:
        raise UnusedFieldsRefused(f"{STRICT_HEADER} is set and these fields are not used: {', '.join(locations)}.",
                                  param=locations[0])
    if locations:
        log.warning("request_fields_unused locations=%s", locations)
    return locations


# scoring
def is_chat_scoring(body: Mapping[str, Any]) -> bool:
    """logprobs true or allowed_token_ids; top_logprobs alone comes here too, to be refused."""
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise InvalidParameter("'logprobs' must be true or false on chat completions.", param="logprobs")
    return logprobs is True or body.get("allowed_token_ids") is not None or body.get("top_logprobs") is not None


def is_completion_scoring(body: Mapping[str, Any]) -> bool:
    return not is_no_change("logprobs", body.get("logprobs")) or body.get("allowed_token_ids") is not None


def _bool(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidParameter(f"'{name}' must be true or false.", param=name)
    return value


def scoring_common(fields: Mapping[str, Any]) -> tuple[tuple[int, ...] | None, float, bool]:
    """The allowed set, the temperature (0-2, and 0 or >= 0.001) and the key style of any scoring ask."""
    temperature = fields.get("temperature")
    if temperature is not None:
        check_number("temperature", temperature)
    allowed = check_allowed(fields["allowed_token_ids"]) if fields.get("allowed_token_ids") is not None else None
    return allowed, check_scoring_temperature(temperature), _bool(fields, "return_tokens_as_token_ids", False)


def completion_scoring_params(fields: Mapping[str, Any]) -> ScoringParams:
    """logprobs 0-20 and/or allowed_token_ids; with both, every allowed token is returned."""
    allowed, temperature, as_ids = scoring_common(fields)
    logprobs = fields.get("logprobs")
    n = None if is_no_change("logprobs", logprobs) else check_top_n("logprobs", logprobs)
    top_n = len(allowed) if allowed is not None and n is not None else (n or 0)
    echo = _bool(fields, "echo", False)
    if echo and n is None:
        raise InvalidParameter("'echo' returns the prompt's log-probabilities and needs 'logprobs' (0-20).",
                               param="echo")
    budget = fields.get("max_tokens", fields.get("max_completion_tokens"))
    return ScoringParams(allowed, temperature, top_n, n is not None, as_ids, echo=echo, next_token=budget != 0)


def chat_scoring_params(fields: Mapping[str, Any]) -> ScoringParams:
    """logprobs true, top_logprobs 0-20, allowed_token_ids."""
    logprobs, top = fields.get("logprobs"), fields.get("top_logprobs")
    if top is not None and logprobs is not True:
        raise InvalidParameter("'top_logprobs' needs logprobs: true.", param="top_logprobs")
    allowed, temperature, as_ids = scoring_common(fields)
    top_n = check_top_n("top_logprobs", top) if top is not None else 0
    return ScoringParams(allowed, temperature, top_n, logprobs is True, as_ids)


def _scoring_seed(body: Mapping[str, Any]) -> int | None:
    """Accepted and echoed on scoring requests, where it changes nothing."""
    return sampling_params({"seed": body.get("seed")}).seed


def _check_scoring(body: Mapping[str, Any], echo: bool = False) -> None:
    if echo:
        max_tokens_of({k: v for k, v in body.items() if k in ("max_tokens", "max_completion_tokens") and v != 0})
    else:
        max_tokens_of(body)
    check_scoring_shape(body, echo)


# generation
def response_format_constraint(value: Any, undeclared: str = "omit") -> JsonConstraint | None:
    """response_format's constraint. ``{"type": "json_object", "schema": {...}}`` (llama.cpp server's shape,
    sent by older instructor, Together and Fireworks clients) enforces that schema, checked as a json_schema's
    is; X-miLLM-Constrained then says ``json_object;schema``."""
    if isinstance(value, dict) and value.get("type") == "json_object" and value.get("schema") is not None:
        if not isinstance(value["schema"], dict):
            raise ResponseFormatUnsupported("'response_format.schema' must be a JSON Schema object.",
                                            param="response_format")
        checked = check_response_format({"type": "json_schema",
                                         "json_schema": {"name": "schema", "schema": value["schema"]}}, undeclared)
        assert checked is not None
        return replace(checked, kind="json_object", name=None)
    return check_response_format(value, undeclared)


def readout_ask(raw: dict[str, Any] | None) -> ReadoutAsk | None:
    """return_sae_activations without the keys reported as unread (and null ones: absent), its shape checked;
    which SAE it reads is bound by the engine."""
    if raw is None:
        return None
    return check_readout({k: v for k, v in raw.items() if k in NESTED_KEYS["return_sae_activations"]
                          and v is not None})


def include_usage(body: Mapping[str, Any]) -> bool:
    """stream_options.include_usage: false leaves usage off the final streamed chunk (absent: on, as the spec
    says the final chunk carries it)."""
    options = body.get("stream_options") or {}
    value = options.get("include_usage")
    if value is None:
        return True
    if not isinstance(value, bool):
        raise InvalidParameter("'stream_options.include_usage' must be true or false.",
                               param="stream_options.include_usage")
    return value


def constraint_for(body: Mapping[str, Any], params: SamplingParams, undeclared: str = "omit") -> Constraint | None:
    """response_format and tools (one constraint: text or calls, the text satisfying response_format), with the
    combination they cannot live with (response_format and stop; tools take stop: it cuts free text only).
    Streamed, every prefix the constraint lets out extends to a valid document, and a stream cut by max_tokens
    ends with finish_reason "length", as a whole response does."""
    text = response_format_constraint(body.get("response_format"), undeclared)
    constraint: Constraint | None = text
    if body.get("tools") is not None or body.get("tool_choice") is not None:
        constraint = tool_constraint(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"),
                                     text, undeclared) or text
    if text is not None and params.stop:  # beside tools, stops apply to free text only: the engine's stop_scope
        raise ResponseFormatUnsupported("'response_format' cannot be combined with 'stop': a stop string could cut "
                                        "a document and report it complete.", param="response_format")
    return constraint


def refuse_under_batching(built: Built) -> None:
    """response_format on a server with continuous batching enabled and MILLM_BATCHING_CONSTRAINTS=refuse:
    refused before loading (the spec's rule; by default a constrained row is batched like any other). Tool
    calls are not refused there (Open WebUI sends tools with every message): they are served on the serial
    path, alone."""
    constraint = built.constraint
    if isinstance(constraint, ToolConstraint):
        constraint = constraint.text
    if constraint is not None:
        raise ResponseFormatUnsupported("'response_format' cannot be honoured while continuous batching is enabled "
                                        "on this server (MILLM_BATCHING with MILLM_BATCHING_CONSTRAINTS=refuse); "
                                        "it was refused rather than ignored.", param="response_format")


# arguments miLLM passes to the template renderer itself; a client's value would clash with them (a 500)
TEMPLATE_ARGUMENTS = ("tokenize", "add_generation_prompt", "return_dict", "continue_final_message", "conversation",
                      "messages", "return_tensors", "padding", "truncation", "max_length", "tokenizer_kwargs",
                      "return_assistant_tokens_mask", "sanitize_control_tokens", TOOLS_KWARG)


def check_template_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """chat_template_kwargs for the model's template: never miLLM's own rendering arguments, and never a
    template of the client's own (``chat_template``: arbitrary Jinja rendered on the server)."""
    if clash := [k for k in kwargs if k in TEMPLATE_ARGUMENTS]:
        raise InvalidParameter(f"'chat_template_kwargs' cannot set {', '.join(repr(k) for k in clash)}: miLLM "
                               "sets those itself.", param=f"chat_template_kwargs.{clash[0]}")
    if "chat_template" in kwargs:
        raise InvalidParameter("'chat_template_kwargs.chat_template' would render a client's own template on the "
                               "server; the model's template is used.", param="chat_template_kwargs.chat_template")
    documents = kwargs.get("documents")
    if documents is not None and (not isinstance(documents, list) or not all(isinstance(d, dict) for d in documents)):
        raise InvalidParameter("'chat_template_kwargs.documents' must be a list of objects (the template's "
                               "documents).", param="chat_template_kwargs.documents")
    return kwargs


def _stream(params: SamplingParams, stream: bool) -> bool:
    if stream and params.n > 1:
        raise InvalidParameter("'n' above 1 cannot be streamed; send stream: false or n: 1.", param="n")
    return stream


def _check_readout(readout: ReadoutAsk | None, rows: int) -> None:
    """When the request asks for a readout, the ``rows`` it would read are within the bound."""
    if readout is not None:
        check_readout_rows(rows)


def _conversations(wire: ChatCompletionRequest, engine: str) -> list[list[dict[str, Any]]]:
    """``messages`` and each of ``extra_messages``, checked (tool calls and results too) and shaped for the
    engine's templates."""
    conversations = [template_messages(check_tool_history(check_messages(wire.messages)), engine)]
    conversations += [template_messages(check_tool_history(check_messages(c, f"extra_messages[{k}]"),
                                                           f"extra_messages[{k}]"), engine)
                      for k, c in enumerate(wire.extra_messages or [])]
    return conversations


def _chat_scoring(body: Any, model: str, ignored: list[str], conversations: list[list[dict[str, Any]]],
                  kwargs: dict[str, Any], readout: ReadoutAsk | None) -> Built:
    """A chat scoring request: one row a conversation, scored one at a time."""
    _check_scoring(body)
    scoring_params = chat_scoring_params(body)
    names = ["messages"] + [f"extra_messages[{k}]" for k in range(len(conversations) - 1)]
    rows = [ScoreRow(ChatPrompt(m, kwargs), scoring_params, where) for m, where in zip(conversations, names)]
    _check_readout(readout, len(rows))
    return Built("chat", model, ignored, score=ScoreRequest(rows, one_at_a_time=True, readout=readout),
                 seed=_scoring_seed(body))


def _with_tools(kwargs: dict[str, Any], constraint: Constraint | None) -> dict[str, Any]:
    """The template's variables, with the tools a tool constraint lets the model call (the model is told of
    them)."""
    if isinstance(constraint, ToolConstraint):
        return {**kwargs, TOOLS_KWARG: constraint.prompt_tools()}
    return kwargs


def build_chat(body: Any, engine_of: EngineOf, strict: bool = False, limits: Limits | None = None) -> Built:
    """A chat completion, a chat scoring request, or a refusal."""
    wire = parse(ChatCompletionRequest, body)
    limits = limits or Limits.of()
    check_prompts("extra_messages", 1 + len(wire.extra_messages or []), limits)
    engine = engine_of(wire.model)
    scoring = engine == "transformers" and is_chat_scoring(body)
    ignored = decide_fields("chat", engine, body, strict, scoring, limits)
    conversations = _conversations(wire, engine)
    kwargs = check_template_kwargs(wire.chat_template_kwargs or {})
    readout = readout_ask(wire.return_sae_activations)
    if scoring:
        return _chat_scoring(body, wire.model, ignored, conversations, kwargs, readout)
    params = sampling_params(body)
    stream = _stream(params, bool(wire.stream))
    constraint = constraint_for(body, params, limits.undeclared)
    intensity = parse_intensity(body.get("steering_intensity"))
    check_rows("extra_messages", len(conversations), params.n, limits)
    _check_readout(readout, len(conversations) * params.n)
    kwargs = _with_tools(kwargs, constraint)
    generation = GenerationRequest([ChatPrompt(m, kwargs) for m in conversations], params,
                                   readout=readout, constraint=constraint)
    return Built("chat", wire.model, ignored, stream, [generation], profile=wire.profile, intensity=intensity,
                 scope=parse_scope(wire.steering_scope), seed=params.seed,
                 seed_scope="batch-shape" if len(conversations) > 1 else "request",
                 include_usage=not stream or include_usage(body), probes=parse_asks(wire.probes))


def _completion_scoring(body: Any, model: str, ignored: list[str], prompts: list[TextPrompt | TokenPrompt],
                        readout: ReadoutAsk | None) -> Built:
    """A completion scoring request: one row a prompt (``echo`` scores the prompt's own tokens)."""
    echo = _bool(body, "echo", False)
    _check_scoring(body, echo)
    scoring_params = completion_scoring_params(body)
    rows = [ScoreRow(p, scoring_params, p.where) for p in prompts]
    _check_readout(readout, len(rows))
    return Built("completions", model, ignored, score=ScoreRequest(rows, readout=readout),
                 seed=_scoring_seed(body), prompt_texts=[p.text if isinstance(p, TextPrompt) else None
                                                         for p in prompts])


def _check_texts(prompts: list[TextPrompt | TokenPrompt]) -> None:
    """Each text prompt's characters, as generation takes them."""
    for prompt in prompts:
        if isinstance(prompt, TextPrompt):
            check_prompt_text(prompt.where, prompt.text)


def build_completion(body: Any, engine_of: EngineOf, strict: bool = False, limits: Limits | None = None) -> Built:
    """A text completion (each prompt of a list its own choice, seeded separately), scoring, or a refusal."""
    wire = parse(CompletionRequest, body)
    limits = limits or Limits.of()
    engine = engine_of(wire.model)
    scoring = engine == "transformers" and is_completion_scoring(body)
    ignored = decide_fields("completions", engine, body, strict, scoring, limits)
    special = _bool(body, "add_special_tokens", True)
    prompts = completion_prompts(wire.prompt, special)
    check_prompts("prompt", len(prompts), limits)
    check_prompt_tokens("prompt", sum(len(p.ids) for p in prompts if isinstance(p, TokenPrompt)), limits)
    readout = readout_ask(wire.return_sae_activations)
    if scoring:
        return _completion_scoring(body, wire.model, ignored, prompts, readout)
    _check_texts(prompts)
    sampling = sampling_params(body)
    check_rows("prompt", len(prompts), sampling.n, limits)
    _check_readout(readout, len(prompts) * sampling.n)
    generations = [GenerationRequest([p], sampling, readout=readout) for p in prompts]
    stream = _stream(sampling, bool(wire.stream))
    return Built("completions", wire.model, ignored, stream, generations, scope=parse_scope(wire.steering_scope),
                 seed=sampling.seed, include_usage=not stream or include_usage(body), probes=parse_asks(wire.probes))


def completion_prompts(raw: Any, special: bool) -> list[TextPrompt | TokenPrompt]:
    """OpenAI's prompt shapes: a string, a list of strings, a list of token ids, or a list of such lists."""
    if isinstance(raw, str):
        return [TextPrompt(raw, special)]
    if not raw:
        raise InvalidParameter("'prompt' is an empty list.", param="prompt")
    if all(isinstance(t, int) for t in raw):
        return [_tokens(raw, "prompt")]
    return [TextPrompt(p, special, f"prompt[{i}]") if isinstance(p, str) else _tokens(p, f"prompt[{i}]")
            for i, p in enumerate(raw)]


def _tokens(ids: list[int], where: str) -> TokenPrompt:
    if not ids:
        raise InvalidParameter(f"'{where}' is an empty list of token ids.", param=where)
    if any(t < 0 for t in ids):
        raise InvalidParameter(f"'{where}' has a negative token id.", param=where)
    return TokenPrompt(tuple(ids), where)


def _encoding(value: str | None) -> str:
    """``encoding_format``: float (the default) or base64."""
    encoding = value or "float"
    if encoding not in ENCODINGS:
        raise InvalidParameter(f"'encoding_format' must be float or base64, got {encoding!r}.",
                               param="encoding_format")
    return encoding


def _embedding_inputs(raw: Any) -> list[Any]:
    """``input`` as a list of inputs: a string or one list of token ids is one input; never an empty list."""
    inputs: list[Any] = [raw] if isinstance(raw, str) or (raw and all(isinstance(t, int) for t in raw)) else list(raw)
    if not inputs:
        raise InvalidParameter("'input' is an empty list.", param="input")
    return inputs


def build_embedding(body: Any, engine_of: EngineOf, strict: bool = False, limits: Limits | None = None) -> Built:
    """Embeddings of a string, a list of strings, token ids or a list of token-id lists."""
    wire = parse(EmbeddingRequest, body)
    engine_of(wire.model)
    ignored = decide_fields("embeddings", "transformers", body, strict, False)
    encoding = _encoding(wire.encoding_format)
    inputs = _embedding_inputs(wire.input)
    limits = limits or Limits.of()
    check_embedding_inputs(len(inputs), limits)
    check_prompt_tokens("input", sum(len(i) for i in inputs if isinstance(i, list)), limits)
    return Built("embeddings", wire.model, ignored, embed_inputs=inputs, encoding=encoding)
