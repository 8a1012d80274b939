"""Plain, already-validated request values the engine works with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from millm.steering.target import ReadoutAsk, RequestSteering, Scope, Watch
    from millm.structured.tools import Constraint


Json: TypeAlias = dict[str, "Json"] | list["Json"] | str | int | float | bool | None
"""A value decoded from a request's JSON (a message, a template argument)."""


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop. Built by ``millm.requests.validation``, never by hand on the wire."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0  # multiplicative, over the prompt's and the generated tokens (vLLM's field)
    seed: int | None = None
    n: int = 1


@dataclass(frozen=True)
class ChatPrompt:
    """A conversation to render with the model's chat template."""

    messages: list[dict[str, Json]]
    template_kwargs: dict[str, Json] = field(default_factory=dict)


@dataclass(frozen=True)
class TextPrompt:
    """Raw text given to the model verbatim (no chat template)."""

    text: str
    add_special_tokens: bool = True
    where: str = "prompt"  # how errors name it (``prompt[2]`` in a list)


@dataclass(frozen=True)
class TokenPrompt:
    """Token ids given to the model as they are (OpenAI's token-id prompts); ``where`` names it in errors."""

    ids: tuple[int, ...]
    where: str = "prompt"


Prompt = ChatPrompt | TextPrompt | TokenPrompt


def prompt_names(prompts: list[Prompt]) -> list[str]:
    """How errors name each prompt of a request: messages, extra_messages[k], prompt or prompt[i]."""
    def name(i: int, prompt: Prompt) -> str:
        if isinstance(prompt, ChatPrompt):
            return "messages" if i == 0 else f"extra_messages[{i - 1}]"
        return prompt.where

    return [name(i, p) for i, p in enumerate(prompts)]


@dataclass(frozen=True)
class GenerationRequest:
    """One or more prompts, each answered ``params.n`` times; choice index = prompt * n + j."""

    prompts: list[Prompt]
    params: SamplingParams = field(default_factory=SamplingParams)
    steering: RequestSteering | None = None  # what steers it (a profile, a dial); None: the live values
    readout: ReadoutAsk | None = None  # return_sae_activations, its shape checked
    constraint: Constraint | None = None  # response_format or tools, one matcher per row
    scope: Scope = "all"  # steering_scope: the positions its steering applies to
    probes: tuple[Watch, ...] = ()  # the probes that watch it (the attached ones and its ``probes`` field)


def check_token_ids(prompt: TokenPrompt, vocab_size: int) -> list[int]:
    """A token-id prompt's ids, each inside the loaded model's vocabulary (400 naming the prompt)."""
    from millm.errors import InvalidParameter

    if bad := [t for t in prompt.ids if not 0 <= t < vocab_size]:
        raise InvalidParameter(f"'{prompt.where}' has token id {bad[0]}, outside this model's vocabulary "
                               f"(0-{vocab_size - 1}).", param=prompt.where)
    return list(prompt.ids)


@dataclass(frozen=True)
class Forced:
    """A teacher-forced read for research: ``ids`` (a prompt and an answer) read in one forward, steered by
    ``steering``'s own values alone (None: unsteered), and at each answer position (``start`` on) the probability
    that the token there is one of ``watch``."""

    ids: tuple[int, ...]
    start: int
    steering: RequestSteering | None = None
    watch: tuple[int, ...] = ()
