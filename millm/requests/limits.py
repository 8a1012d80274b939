"""What one request may ask of the engine: rows, prompts, embedding inputs and prompt tokens, the two
serving policies that change the field table (MILLM_TOOLS, MILLM_GGUF_STEERING) and the reading of a schema's
unset additionalProperties (MILLM_UNDECLARED_PROPERTIES).

Without bounds one request could hold the engine or the memory (1,000 conversations ran 69 s with every
other client waiting; 16 choices x 101 conversations took 4 GB). Each bound is a setting (MILLM_MAX_*,
documented in docs/settings.md); past it the request is refused with 400 naming the field, before any model work
(prompt tokens: once tokenised, before any forward pass).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from millm.config import Settings, get_settings
from millm.engine.plan import Plan
from millm.errors import InvalidParameter


@dataclass(frozen=True)
class Limits:
    """The bounds in force: the settings' values (their defaults are written once, in millm.config)."""

    max_rows: int  # MILLM_MAX_ROWS: generated choices per request (conversations or prompts x n)
    max_prompts: int  # MILLM_MAX_PROMPTS: conversations (messages + extra_messages) or prompts per request
    max_embedding_inputs: int  # MILLM_MAX_EMBEDDING_INPUTS: inputs per embeddings request (OpenAI's cap)
    max_prompt_tokens: int  # MILLM_MAX_PROMPT_TOKENS: prompt tokens over every row of a request
    tools: str = "honour"  # MILLM_TOOLS: whether a request may ask for tool calls ("refuse": 400, the spec's table)
    gguf_steering: bool = False  # MILLM_GGUF_STEERING: GGUF chat honours profile and steering_intensity
    undeclared: str = "omit"  # MILLM_UNDECLARED_PROPERTIES: "allow" generates keys a schema did not declare

    @classmethod
    def of(cls, settings: Settings | None = None) -> Limits:
        """The limits ``settings`` set (the process settings by default)."""
        s = settings or get_settings()
        return cls(s.max_rows, s.max_prompts, s.max_embedding_inputs, s.max_prompt_tokens, s.tools, s.gguf_steering,
                   s.undeclared_properties)


def _refuse(field: str, what: str, count: int, limit: int, setting: str) -> InvalidParameter:
    return InvalidParameter(f"'{field}' asks for {count} {what}; this server takes at most {limit} per request "
                            f"({setting}).", param=field)


def check_prompts(field: str, count: int, limits: Limits) -> None:
    """At most ``max_prompts`` conversations or prompts; ``field`` is what carries them."""
    if count > limits.max_prompts:
        raise _refuse(field, "prompts" if field == "prompt" else "conversations", count, limits.max_prompts,
                      "MILLM_MAX_PROMPTS")


def check_rows(field: str, prompts: int, n: int, limits: Limits) -> None:
    """At most ``max_rows`` generated choices: ``prompts`` x ``n``; the error names ``n`` when it is the multiplier
    that crosses the bound, else ``field``."""
    rows = prompts * n
    if rows > limits.max_rows:
        where = "n" if n > 1 else field
        raise InvalidParameter(f"{prompts} {'prompt' if field == 'prompt' else 'conversation'}"
                               f"{'s' if prompts != 1 else ''} x n={n} asks for {rows} choices; this server "
                               f"generates at most {limits.max_rows} per request (MILLM_MAX_ROWS).", param=where)


def check_embedding_inputs(count: int, limits: Limits) -> None:
    """At most ``max_embedding_inputs`` inputs."""
    if count > limits.max_embedding_inputs:
        raise _refuse("input", "inputs", count, limits.max_embedding_inputs, "MILLM_MAX_EMBEDDING_INPUTS")


def check_prompt_tokens(field: str, tokens: int, limits: Limits) -> None:
    """At most ``max_prompt_tokens`` prompt tokens over every row of the request."""
    if tokens > limits.max_prompt_tokens:
        raise InvalidParameter(f"'{field}' holds {tokens} prompt tokens over the request's rows; this server "
                               f"takes at most {limits.max_prompt_tokens} per request (MILLM_MAX_PROMPT_TOKENS).",
                               param=field)


def prompt_tokens(plans: Sequence[Plan]) -> int:
    """Prompt tokens over every row of prepared plans: each prompt counts once per choice (n) it feeds."""
    return sum(len(ids) * plan.params.n for plan in plans for ids in plan.prompt_ids)
