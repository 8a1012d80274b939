"""The one validation layer for request values, shared by the CLI, the TUI and the server.

Every range is written once, in ``RANGES``; every refusal names the field it refuses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from millm.engine.params import SamplingParams
from millm.errors import InvalidParameter

SEED_MAX = 2**32 - 1
N_MAX = 128
# scoring only: a scoring temperature above 0 and below this overflows logits / T into inf and NaN (generation
# samples from (logits - max) / T, finite for any T > 0, so it honours the whole 0-2 range)
MIN_SCORING_TEMPERATURE = 0.001

# field -> (low, high), both inclusive
RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "frequency_penalty": (-2.0, 2.0),
    "presence_penalty": (-2.0, 2.0),
    "repetition_penalty": (0.01, 10.0),  # vLLM's extension: 1 changes nothing
}


def check_number(name: str, value: Any) -> float:
    """A finite real number inside ``RANGES[name]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidParameter(f"'{name}' must be a number, got {value!r}.", param=name)
    low, high = RANGES[name]
    if not low <= value <= high:
        raise InvalidParameter(f"'{name}' must be between {low:g} and {high:g}, got {value!r}.", param=name)
    return float(value)


def check_scoring_temperature(value: Any) -> float:
    """A scoring temperature (absent: 1): the generation range, and 0 or at least MIN_SCORING_TEMPERATURE (scoring
    divides the logits themselves, and reports their log-probabilities)."""
    if value is None:
        return 1.0
    temperature = check_number("temperature", value)
    if 0 < temperature < MIN_SCORING_TEMPERATURE:
        raise InvalidParameter(f"'temperature' {value!r} would overflow the logits; use 0 (greedy, no scaling) or "
                               f"at least {MIN_SCORING_TEMPERATURE:g}.", param="temperature")
    return temperature


def check_int(name: str, value: Any, *, low: int, high: int | None = None) -> int:
    """An integer (never a bool) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParameter(f"'{name}' must be an integer, got {value!r}.", param=name)
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise InvalidParameter(f"'{name}' must be {bound}, got {value}.", param=name)
    return value


MAX_STOPS = 16  # stop sequences per request (OpenAI takes 4)
MAX_STOP_CHARS = 1024  # characters per stop sequence


def check_stop(value: Any) -> tuple[str, ...]:
    """A stop string or a list of them; empty strings would match everywhere and are refused. Their number and
    length are bounded: every decoded token is checked against each of them on the engine thread, so their
    size is work that grows with every step."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
        raise InvalidParameter("'stop' must be a string or a list of strings.", param="stop")
    if any(s == "" for s in items):
        raise InvalidParameter("'stop' must not contain empty strings.", param="stop")
    if len(items) > MAX_STOPS:
        raise InvalidParameter(f"'stop' holds {len(items)} sequences; at most {MAX_STOPS}.", param="stop")
    if any(len(s) > MAX_STOP_CHARS for s in items):
        raise InvalidParameter(f"'stop' sequences are at most {MAX_STOP_CHARS} characters.", param="stop")
    return tuple(dict.fromkeys(items))


def max_tokens_of(fields: Mapping[str, Any]) -> int | None:
    """max_tokens, or OpenAI's newer max_completion_tokens; both given and different is refused."""
    mt, mct = fields.get("max_tokens"), fields.get("max_completion_tokens")
    if mt is not None and mct is not None and mt != mct:
        raise InvalidParameter(
            f"'max_tokens' ({mt!r}) and 'max_completion_tokens' ({mct!r}) disagree; send one of them.",
            param="max_completion_tokens",
        )
    name = "max_tokens" if mt is not None else "max_completion_tokens"
    value = mt if mt is not None else mct
    return None if value is None else check_int(name, value, low=1)


def sampling_params(fields: Mapping[str, Any]) -> SamplingParams:
    """Validate the sampling fields of a request (absent or null means the default)."""
    kw: dict[str, Any] = {}
    for name in RANGES:
        if fields.get(name) is not None:
            kw[name] = check_number(name, fields[name])
    if fields.get("seed") is not None:
        kw["seed"] = check_int("seed", fields["seed"], low=0, high=SEED_MAX)
    if fields.get("n") is not None:
        kw["n"] = check_int("n", fields["n"], low=1, high=N_MAX)
    if fields.get("stop") is not None:
        kw["stop"] = check_stop(fields["stop"])
    kw["max_tokens"] = max_tokens_of(fields)
    return SamplingParams(**kw)


def check_prompt_text(name: str, text: Any) -> str:
    """A non-empty prompt string."""
    if not isinstance(text, str):
        raise InvalidParameter(f"'{name}' must be a string.", param=name)
    if text == "":
        raise InvalidParameter(f"'{name}' is empty.", param=name)
    return text


ROLES = ("system", "user", "assistant", "tool", "function", "developer")


def message_text(content: Any, where: str) -> str:
    """The text of a message's content: a string, a list of text parts, or null (empty)."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidParameter(
                    f"'{where}[{i}]' must be a text part {{\"type\": \"text\", \"text\": ...}}; "
                    "this model takes text only.", param=f"{where}[{i}]")
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidParameter(f"'{where}' must be a string or a list of text parts.", param=where)


def check_messages(messages: Any, name: str = "messages") -> list[dict[str, Any]]:
    """A non-empty list of chat messages, normalised to ``{"role", "content": str, ...}``."""
    if not isinstance(messages, list) or not messages:
        raise InvalidParameter(f"'{name}' must be a non-empty list of messages.", param=name)
    out = []
    for i, msg in enumerate(messages):
        where = f"{name}[{i}]"
        if not isinstance(msg, dict):
            raise InvalidParameter(f"'{where}' must be an object.", param=where)
        role = msg.get("role")
        if role not in ROLES:
            raise InvalidParameter(f"'{where}.role' must be one of {', '.join(ROLES)}, got {role!r}.",
                                   param=f"{where}.role")
        out.append({**msg, "content": message_text(msg.get("content"), f"{where}.content")})
    if all(m["content"] == "" for m in out):
        raise InvalidParameter(f"'{name}' holds no text: the prompt is empty.", param=name)
    return out
