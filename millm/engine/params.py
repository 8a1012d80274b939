"""Plain, already-validated request values the engine works with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop. Built by ``millm.validation``, never by hand on the wire."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    n: int = 1


@dataclass(frozen=True)
class ChatPrompt:
    """A conversation to render with the model's chat template."""

    messages: list[dict[str, Any]]
    template_kwargs: dict[str, Any] = field(default_factory=dict)


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
    override: Any = None  # a steering Override for this request only (per-request profile)
    readout: dict[str, Any] | None = None  # the raw return_sae_activations ask
    constraint: Any = None  # a JsonConstraint (response_format), one matcher per row


def check_token_ids(prompt: TokenPrompt, vocab_size: int) -> list[int]:
    """A token-id prompt's ids, each inside the loaded model's vocabulary (400 naming the prompt)."""
    from millm.errors import InvalidParameter

    if bad := [t for t in prompt.ids if not 0 <= t < vocab_size]:
        raise InvalidParameter(f"'{prompt.where}' has token id {bad[0]}, outside this model's vocabulary "
                               f"(0-{vocab_size - 1}).", param=prompt.where)
    return list(prompt.ids)
