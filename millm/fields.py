"""The field table: for each request field, route and engine, whether it is used, refused or reported.

One source of truth shared by the server and any other front end. Every field of a request is
honoured (used), refused with ``field_not_honoured``, or reported in ``X-miLLM-Ignored-Fields``;
none is dropped silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from millm.errors import FieldNotHonoured

USE, REFUSE, PENDING, REPORT = "use", "refuse", "pending", "report"

# column order of every row: each route, split by engine, with scoring requests as routes of their own
COLUMNS = (("chat", "transformers"), ("chat-scoring", "transformers"), ("chat", "llama.cpp"),
           ("completions", "transformers"), ("completions-scoring", "transformers"), ("completions", "llama.cpp"),
           ("embeddings", "transformers"))
_U, _R, _P, _X = USE, REFUSE, PENDING, REPORT

TABLE: dict[str, tuple[str, str, str, str, str, str, str]] = {
    # field                      chat-tf score  gguf  compl score  gguf  embeddings
    "model":                      (_U, _U, _U, _U, _U, _U, _U),
    "messages":                   (_U, _U, _U, _X, _X, _X, _X),
    "extra_messages":             (_U, _U, _U, _X, _X, _X, _X),
    "prompt":                     (_X, _X, _X, _U, _U, _U, _X),
    "input":                      (_X, _X, _X, _X, _X, _X, _U),
    "encoding_format":            (_X, _X, _X, _X, _X, _X, _U),
    "stream":                     (_U, _U, _U, _U, _U, _U, _X),
    "stream_options":             (_U, _X, _U, _U, _X, _U, _X),
    "temperature":                (_U, _U, _U, _U, _U, _U, _X),
    "top_p":                      (_U, _X, _U, _U, _X, _U, _X),
    "stop":                       (_U, _X, _U, _U, _X, _U, _X),
    "frequency_penalty":          (_U, _X, _U, _U, _X, _U, _X),
    "presence_penalty":           (_U, _X, _U, _U, _X, _U, _X),
    "max_tokens":                 (_U, _U, _U, _U, _U, _U, _X),
    "max_completion_tokens":      (_U, _U, _U, _U, _U, _U, _R),
    "n":                          (_U, _U, _R, _R, _U, _R, _R),
    "seed":                       (_U, _U, _U, _U, _U, _U, _R),
    "chat_template_kwargs":       (_U, _U, _X, _X, _X, _X, _X),
    "logprobs":                   (_R, _U, _R, _R, _U, _R, _R),
    "allowed_token_ids":          (_R, _U, _R, _R, _U, _R, _R),
    "return_tokens_as_token_ids": (_X, _U, _R, _X, _U, _R, _R),
    "add_special_tokens":         (_X, _X, _X, _U, _U, _R, _X),
    "top_logprobs":               (_R, _U, _R, _R, _R, _R, _R),
    "response_format":            (_U, _R, _R, _R, _R, _R, _R),
    "profile":                    (_U, _R, _R, _R, _R, _R, _R),
    "steering_intensity":         (_U, _R, _R, _R, _R, _R, _R),
    "return_sae_activations":     (_U, _R, _R, _U, _R, _R, _R),
    "steering":                   (_R, _R, _R, _R, _R, _R, _R),
    "dimensions":                 (_R, _R, _R, _R, _R, _R, _R),
    "tools":                      (_R, _R, _R, _R, _R, _R, _R),
    "tool_choice":                (_R, _R, _R, _R, _R, _R, _R),
    "functions":                  (_R, _R, _R, _R, _R, _R, _R),
    "function_call":              (_R, _R, _R, _R, _R, _R, _R),
    "logit_bias":                 (_R, _R, _R, _R, _R, _R, _R),
    "echo":                       (_X, _X, _X, _R, _U, _R, _X),
    "suffix":                     (_X, _X, _X, _R, _R, _R, _X),
    "best_of":                    (_X, _X, _X, _R, _R, _R, _X),
}

# values that change nothing and are accepted everywhere (an explicit null too)
NO_CHANGE: dict[str, list[Any]] = {
    "n": [1], "logprobs": [False], "response_format": [{"type": "text"}], "tools": [[]], "logit_bias": [{}],
    "echo": [False], "best_of": [1], "stream": [False],
    "tool_choice": ["none"],  # with no tools (LlamaIndex sends it): no tool can be called either way
}

MESSAGE_KEYS = {"role", "content"}
PART_KEYS = {"type", "text"}
ROUTE_NAMES = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings"}


def column(route: str, engine: str, scoring: bool = False) -> tuple[str, str]:
    """The table column of a request: its route (a scoring one when scoring) and engine."""
    if route == "embeddings":
        return route, "transformers"
    if scoring and engine == "transformers":
        return f"{route}-scoring", engine
    return route, engine


def policy(field: str, route: str, engine: str, scoring: bool = False) -> str:
    """What the table says for ``field`` on ``route`` with ``engine`` (unknown fields are reported)."""
    row = TABLE.get(field)
    if row is None:
        return REPORT
    return row[COLUMNS.index(column(route, engine, scoring))]


def _refusal(field: str, route: str, engine: str, kind: str, scoring: bool) -> FieldNotHonoured:
    where = ROUTE_NAMES[route] + ("" if route == "embeddings" else f" with the {engine} engine")
    if scoring:
        return FieldNotHonoured(f"'{field}' cannot apply to a scoring request on {where}: scoring is never "
                                "steered, constrained or read out; it was refused rather than ignored.", param=field)
    if kind == PENDING:
        return FieldNotHonoured(f"'{field}' is not implemented yet on {where}; it was refused rather than ignored.",
                                param=field)
    return FieldNotHonoured(f"'{field}' cannot be honoured on {where}; it was refused rather than ignored.",
                            param=field)


TOOL_FIELDS = ("tools", "tool_choice", "functions", "function_call")


def _refusals(refused: list[tuple[str, str]], route: str, engine: str, scoring: bool) -> FieldNotHonoured:
    """One refusal naming every refused field; tool calling points to structured output instead."""
    if len(refused) == 1:
        error = _refusal(refused[0][0], route, engine, refused[0][1], scoring)
    else:
        names = [name for name, _ in refused]
        where = ROUTE_NAMES[route] + ("" if route == "embeddings" else f" with the {engine} engine")
        error = FieldNotHonoured(f"{', '.join(repr(n) for n in names)} cannot be honoured on {where}; they were "
                                 "refused rather than ignored.", param=names[0])
    if any(name in TOOL_FIELDS for name, _ in refused):
        error.message += (" miLLM does not call tools; for structured output send response_format "
                          '{"type": "json_schema", ...}.')
        error.args = (error.message,)
    return error


def _message_locations(messages: Any, prefix: str) -> list[str]:
    """Keys of chat messages (and their content parts) that no template reads."""
    found: list[str] = []
    if not isinstance(messages, list):
        return found
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            continue
        found += [f"{prefix}[{i}].{k}" for k, v in msg.items() if k not in MESSAGE_KEYS and v is not None]
        if isinstance(msg.get("content"), list):
            for j, part in enumerate(msg["content"]):
                if isinstance(part, dict):
                    found += [f"{prefix}[{i}].content[{j}].{k}" for k, v in part.items()
                              if k not in PART_KEYS and v is not None]
    return found


def is_no_change(field: str, value: Any) -> bool:
    """Null, or a value that changes nothing (type-exact: ``logprobs: 0`` is not ``false``)."""
    return value is None or any(type(value) is type(v) and value == v for v in NO_CHANGE.get(field, []))


def check_fields(route: str, engine: str, body: Mapping[str, Any], scoring: bool = False) -> list[str]:
    """Refuse what cannot be honoured; return the locations of fields this request path does not use."""
    ignored: list[str] = []
    refused: list[tuple[str, str]] = []
    for field, value in body.items():
        if is_no_change(field, value):
            continue
        kind = policy(field, route, engine, scoring)
        if kind in (REFUSE, PENDING):
            refused.append((field, kind))
        if kind == REPORT:
            ignored.append(field)
    if refused:
        raise _refusals(refused, route, engine, scoring)
    if policy("messages", route, engine, scoring) == USE:
        ignored += _message_locations(body.get("messages"), "messages")
        extra = body.get("extra_messages")
        if isinstance(extra, list):
            for k, convo in enumerate(extra):
                ignored += _message_locations(convo, f"extra_messages[{k}]")
    return ignored
