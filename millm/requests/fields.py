"""The field table: for each request field, route and engine, whether it is used, refused or reported.

One source of truth shared by the server and any other front end. Every field of a request is
honoured (used), refused with ``field_not_honoured``, or reported in ``X-miLLM-Ignored-Fields``;
none is dropped silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from millm.errors import FieldNotHonoured
from millm.steering.readout import READOUT_KEYS  # return_sae_activations
from millm.structured.tools import tool_locations

USE, REFUSE, PENDING, REPORT = "use", "refuse", "pending", "report"
SETTING = "setting"  # refused by a server setting (MILLM_TOOLS=refuse), whatever the table says

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
    "repetition_penalty":         (_U, _X, _R, _U, _X, _R, _X),  # vLLM's; llama.cpp's counts a window only
    "max_tokens":                 (_U, _U, _U, _U, _U, _U, _X),
    "max_completion_tokens":      (_U, _U, _U, _U, _U, _U, _R),
    "n":                          (_U, _U, _R, _R, _U, _R, _R),
    "seed":                       (_U, _U, _U, _U, _U, _U, _R),
    "chat_template_kwargs":       (_U, _U, _X, _X, _X, _X, _X),
    "logprobs":                   (_R, _U, _R, _R, _U, _R, _R),
    "allowed_token_ids":          (_R, _U, _R, _R, _U, _R, _R),
    "return_tokens_as_token_ids": (_X, _U, _R, _X, _U, _R, _R),
    "add_special_tokens":         (_X, _X, _X, _U, _U, _U, _X),  # llama.cpp: add_bos
    "top_logprobs":               (_R, _U, _R, _R, _R, _R, _R),
    "response_format":            (_U, _R, _R, _R, _R, _R, _R),
    "profile":                    (_U, _R, _R, _R, _R, _R, _R),
    "steering_intensity":         (_U, _R, _R, _R, _R, _R, _R),
    "steering_scope":             (_U, _R, _R, _U, _R, _R, _R),  # miLLM's: where steering applies
    "return_sae_activations":     (_U, _U, _R, _U, _U, _R, _R),
    "probes":                     (_U, _X, _R, _U, _X, _R, _X),  # miLLM's; scoring and embeddings record nothing
    "steering":                   (_R, _R, _R, _R, _R, _R, _R),
    "dimensions":                 (_R, _R, _R, _R, _R, _R, _R),
    "tools":                      (_U, _R, _R, _R, _R, _R, _R),  # chat: refused under MILLM_TOOLS=refuse
    "tool_choice":                (_U, _R, _R, _R, _R, _R, _R),
    "parallel_tool_calls":        (_U, _X, _X, _X, _X, _X, _X),
    "functions":                  (_R, _R, _R, _R, _R, _R, _R),
    "function_call":              (_R, _R, _R, _R, _R, _R, _R),
    "logit_bias":                 (_R, _R, _R, _R, _R, _R, _R),
    "echo":                       (_X, _X, _X, _R, _U, _R, _X),
    "suffix":                     (_X, _X, _X, _R, _R, _R, _X),
    "best_of":                    (_X, _X, _X, _R, _R, _R, _X),
}

# fields used only beside another: without it (absent, null or its no-change value) they are reported
USED_WITH = {"tool_choice": "tools", "parallel_tool_calls": "tools"}

# values that change nothing and are accepted everywhere (an explicit null too)
NO_CHANGE: dict[str, list[Any]] = {
    "n": [1], "logprobs": [False], "response_format": [{"type": "text"}], "tools": [[]], "logit_bias": [{}],
    "echo": [False], "best_of": [1], "stream": [False],
    "tool_choice": ["none", "auto"],  # "none" with no tools (LlamaIndex sends it); "auto" is the default
    "parallel_tool_calls": [True],
    "repetition_penalty": [1, 1.0],
}

MESSAGE_KEYS = ("role", "content")  # what a chat template receives of each message; any other key is reported
# and on the transformers engine, by role: the calls and results of tool calling (rendered by millm.engine.templates)
TOOL_MESSAGE_KEYS = {"assistant": ("tool_calls",), "tool": ("tool_call_id", "name"), "function": ("name",)}
PART_KEYS = {"type", "text"}
# fields read only on a streamed request: reported on any other
STREAM_ONLY = {"stream_options"}
# keys read inside the objects a request uses; any other key there is reported (or refused in strict mode)
# like a top-level field. response_format's depend on its type.
NESTED_KEYS: dict[str, set[str]] = {
    "stream_options": {"include_usage"},
    "return_sae_activations": READOUT_KEYS,
}
RESPONSE_FORMAT_KEYS: dict[str, set[str]] = {
    "text": {"type"},
    "json_object": {"type", "schema"},  # llama.cpp server's shape: the schema is enforced
    "json_schema": {"type", "json_schema"},
}
JSON_SCHEMA_KEYS = {"name", "schema", "strict"}
ROUTE_NAMES = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings"}


def column(route: str, engine: str, scoring: bool = False) -> tuple[str, str]:
    """The table column of a request: its route (a scoring one when scoring) and engine."""
    if route == "embeddings":
        return route, "transformers"
    if scoring and engine == "transformers":
        return f"{route}-scoring", engine
    return route, engine


# MILLM_GGUF_STEERING=true (beyond the spec, whose table above stays as written): GGUF chat is steered through
# llama.cpp's control vectors, so a request's own steering is honoured there
GGUF_STEERING = {("profile", "chat"): USE, ("steering_intensity", "chat"): USE, ("steering_scope", "chat"): USE,
                 ("steering_scope", "completions"): USE}


def policy(field: str, route: str, engine: str, scoring: bool = False, gguf_steering: bool = False) -> str:
    """What the table says for ``field`` on ``route`` with ``engine`` (unknown fields are reported), and what
    ``gguf_steering`` (the serving settings' MILLM_GGUF_STEERING, passed by the caller that holds them) makes of
    GGUF chat's steering fields."""
    row = TABLE.get(field)
    if row is None:
        return REPORT
    where = column(route, engine, scoring)
    if gguf_steering and engine == "llama.cpp" and (field, where[0]) in GGUF_STEERING:
        return GGUF_STEERING[field, where[0]]
    return row[COLUMNS.index(where)]


def _refusal(field: str, route: str, engine: str, kind: str, scoring: bool) -> FieldNotHonoured:
    where = ROUTE_NAMES[route] + ("" if route == "embeddings" else f" with the {engine} engine")
    if scoring:
        return FieldNotHonoured(f"'{field}' cannot apply to a scoring request on {where}: scoring is never "
                                "steered or constrained; it was refused rather than ignored.", param=field)
    if kind == SETTING:
        return FieldNotHonoured(f"'{field}' is refused on this server; it was refused rather than ignored.",
                                param=field)
    if kind == PENDING:
        return FieldNotHonoured(f"'{field}' is not implemented yet on {where}; it was refused rather than ignored.",
                                param=field)
    return FieldNotHonoured(f"'{field}' cannot be honoured on {where}; it was refused rather than ignored.",
                            param=field)


TOOL_FIELDS = ("tools", "tool_choice", "functions", "function_call")
# MILLM_TOOLS=refuse: the spec's table for tool calling (parallel_tool_calls then changes nothing: reported)
TOOLS_REFUSED = {"tools": SETTING, "tool_choice": SETTING, "parallel_tool_calls": REPORT}


def _refusals(refused: list[tuple[str, str]], route: str, engine: str, scoring: bool) -> FieldNotHonoured:
    """One refusal naming every refused field; tool calling points to structured output instead."""
    if len(refused) == 1:
        error = _refusal(refused[0][0], route, engine, refused[0][1], scoring)
    else:
        names = [name for name, _ in refused]
        where = ROUTE_NAMES[route] + ("" if route == "embeddings" else f" with the {engine} engine")
        error = FieldNotHonoured(f"{', '.join(repr(n) for n in names)} cannot be honoured on {where}; they were "
                                 "refused rather than ignored.", param=names[0])
    error.message += _tool_hint(refused, route, engine, scoring)
    error.args = (error.message,)
    return error


def _tool_hint(refused: list[tuple[str, str]], route: str, engine: str, scoring: bool) -> str:
    """What a refusal of tool calling adds: the setting that refuses it, or where tools are honoured."""
    if any(kind == SETTING for _, kind in refused):
        return " This server refuses tool calling (MILLM_TOOLS=refuse)."
    if not any(name in TOOL_FIELDS for name, _ in refused):
        return ""
    if column(route, engine, scoring) == ("chat", "transformers"):
        return " Send 'tools' and 'tool_choice' (OpenAI's current names for functions), which are honoured."
    return (" Tools are called on /v1/chat/completions with the transformers engine (llama.cpp's "
            "grammar path is not measured here); scoring requests never generate.")


def message_keys(role: Any, engine: str) -> tuple[str, ...]:
    """The keys of a message with ``role`` that the ``engine``'s rendering reads."""
    extra = TOOL_MESSAGE_KEYS.get(role, ()) if engine == "transformers" and isinstance(role, str) else ()
    return MESSAGE_KEYS + extra


def _message_locations(messages: Any, prefix: str, engine: str = "transformers") -> list[str]:
    """Keys of chat messages (and their content parts) that no template reads."""
    found: list[str] = []
    if not isinstance(messages, list):
        return found
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            continue
        keys = message_keys(msg.get("role"), engine)
        found += [f"{prefix}[{i}].{k}" for k, v in msg.items() if k not in keys and v is not None]
        found += _part_locations(msg.get("content"), f"{prefix}[{i}].content")
    return found


def _part_locations(content: Any, where: str) -> list[str]:
    """Keys of a message's content parts (when it has a list of them) that no template reads."""
    if not isinstance(content, list):
        return []
    return [f"{where}[{j}].{k}" for j, part in enumerate(content) if isinstance(part, dict)
            for k, v in part.items() if k not in PART_KEYS and v is not None]


def _chat_locations(body: Mapping[str, Any], engine: str) -> list[str]:
    """Unread keys of the messages, and of each conversation of ``extra_messages``."""
    found = _message_locations(body.get("messages"), "messages", engine)
    extra = body.get("extra_messages")
    if isinstance(extra, list):
        for k, convo in enumerate(extra):
            found += _message_locations(convo, f"extra_messages[{k}]", engine)
    return found


def template_messages(messages: list[dict[str, Any]], engine: str = "transformers") -> list[dict[str, Any]]:
    """What the chat template receives of each message: exactly the keys not reported as ignored."""
    return [{k: m[k] for k in message_keys(m.get("role"), engine)
             if k in m and (k in MESSAGE_KEYS or m[k] not in (None, []))} for m in messages]


def _unread(value: Any, known: set[str], where: str) -> list[str]:
    """Keys of an object the request uses that nothing reads (non-null ones), as locations."""
    if not isinstance(value, dict):
        return []
    return [f"{where}.{k}" for k, v in value.items() if k not in known and v is not None]


def nested_locations(body: Mapping[str, Any]) -> list[str]:
    """Unread keys inside the used objects of ``body`` (``stream_options.x``,
    ``response_format.json_schema.description``)."""
    found: list[str] = []
    for name, known in NESTED_KEYS.items():
        found += _unread(body.get(name), known, name)
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") in RESPONSE_FORMAT_KEYS:
        kind = response_format["type"]
        found += _unread(response_format, RESPONSE_FORMAT_KEYS[kind], "response_format")
        if kind == "json_schema":
            found += _unread(response_format.get("json_schema"), JSON_SCHEMA_KEYS, "response_format.json_schema")
    found += tool_locations(body.get("tools"))
    return found


def is_no_change(field: str, value: Any) -> bool:
    """Null, or a value that changes nothing (type-exact: ``logprobs: 0`` is not ``false``)."""
    return value is None or any(type(value) is type(v) and value == v for v in NO_CHANGE.get(field, []))


def check_fields(route: str, engine: str, body: Mapping[str, Any], scoring: bool = False,
                 overrides: Mapping[str, str] | None = None, gguf_steering: bool = False) -> list[str]:
    """Refuse what cannot be honoured (``overrides``: what a server setting makes of fields the table uses;
    ``gguf_steering``: MILLM_GGUF_STEERING of the settings serving the request); return the locations of fields
    this request path does not use."""
    ignored: list[str] = []
    refused: list[tuple[str, str]] = []
    for field, value in body.items():
        if is_no_change(field, value):
            continue
        kind = _kind(field, body, route, engine, scoring, overrides, gguf_steering)
        if kind in (REFUSE, PENDING, SETTING):
            refused.append((field, kind))
        if kind == REPORT:
            ignored.append(field)
    if refused:
        raise _refusals(refused, route, engine, scoring)
    ignored += nested_locations({k: v for k, v in body.items() if k not in ignored})
    if policy("messages", route, engine, scoring) == USE:
        ignored += _chat_locations(body, engine)
    return ignored


def _kind(field: str, body: Mapping[str, Any], route: str, engine: str, scoring: bool,
          overrides: Mapping[str, str] | None, gguf_steering: bool) -> str:
    """What this request does with ``field``: the table's policy, a server setting's override of a field the table
    uses, and a used field with nothing to act on reported."""
    kind = policy(field, route, engine, scoring, gguf_steering)
    if overrides and field in overrides and kind == USE:
        kind = overrides[field]
    return _acted_on(kind, field, body)


def _acted_on(kind: str, field: str, body: Mapping[str, Any]) -> str:
    """``kind``, except that a used field with nothing to act on is reported: ``tool_choice`` "required" with no
    tools (LlamaIndex's default) has nothing to call, and ``stream_options`` nothing to shape unless streamed."""
    if kind != USE:
        return kind
    if field in USED_WITH and is_no_change(USED_WITH[field], body.get(USED_WITH[field])):
        return REPORT
    if field in STREAM_ONLY and body.get("stream") is not True:
        return REPORT
    return kind
