"""What both engines share: a checked plan for a generation request, and chaining plans."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from millm.engine.events import Delta, Event, Finish, Usage
from millm.engine.params import ChatPrompt, Prompt, SamplingParams, TextPrompt
from millm.engine.templates import TOOLS_KWARG
from millm.errors import ContextLengthExceeded, InvalidParameter

if TYPE_CHECKING:
    from millm.engine.base import StepControl
    from millm.steering.target import ReadoutSpec, RequestSteering, Scope, Watch
    from millm.structured.tools import Constraint


@dataclass(frozen=True)
class Plan:
    """A validated generation request: token ids per prompt and the resolved token budget."""

    prompt_ids: list[list[int]]
    params: SamplingParams
    max_tokens: int
    steering: RequestSteering | None = None  # what steers it (its values None, or no steering: the live values)
    readout: ReadoutSpec | None = None  # bound to an attached SAE (transformers only)
    constraint: Constraint | None = None  # enforced token by token (transformers only)
    scope: Scope = "all"  # the positions its steering applies to (steering_scope)
    probes: tuple[Watch, ...] = ()  # the probes that watch it (transformers only)


def token_budget(prompt_ids: list[list[int]], wanted: int | None, window: int, default: int,
                 names: list[str] | None = None, explain: Callable[[int], str | None] | None = None) -> int:
    """max_tokens for the plan: the asked number, checked against the window, or what fits of the default.
    Errors name the prompt (``names``, parallel to ``prompt_ids``) that does not fit, with ``explain``'s
    sentence about it (given its index)."""
    lengths = [len(ids) for ids in prompt_ids]
    longest = max(lengths)
    where = (names or ["prompt"] * len(lengths))[lengths.index(longest)]
    if longest == 0:
        raise InvalidParameter(f"'{where}' tokenises to nothing.", param=where)
    budget = wanted if wanted is not None else min(default, window - longest)
    if longest + max(budget, 1) > window:
        raise ContextLengthExceeded(requested=longest + max(budget, 1), available=window, prompt_tokens=longest,
                                    param=where, detail=explain(lengths.index(longest)) if explain else None)
    return budget


def tool_listing(prompt: Prompt, tokens: int, tokenize: Callable[[Prompt], list[int]]) -> str | None:
    """How many of a chat prompt's ``tokens`` its tool listings take (None without tools): a client that sends
    many tools (Open WebUI's 36 take about 7,000 tokens) learns why a short message does not fit."""
    if not isinstance(prompt, ChatPrompt) or not prompt.template_kwargs.get(TOOLS_KWARG):
        return None
    bare = {k: v for k, v in prompt.template_kwargs.items() if k != TOOLS_KWARG}
    listed = tokens - len(tokenize(replace(prompt, template_kwargs=bare)))
    count = len(prompt.template_kwargs[TOOLS_KWARG])  # type: ignore[arg-type]
    return f"The listings of the {count} tools take {listed} of the prompt's {tokens} tokens."


def prompt_characters(prompt: Prompt) -> int:
    """The characters a prompt's text holds (a chat's every string, roles and content parts alike); token ids 0."""
    if isinstance(prompt, TextPrompt):
        return len(prompt.text)
    if isinstance(prompt, ChatPrompt):
        return _characters(prompt.messages)
    return 0


def _characters(value: object) -> int:
    stack, total = [value], 0
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return total


def check_characters(prompts: Sequence[Prompt], names: Sequence[str], window: int, max_token_bytes: int) -> None:
    """Refuse, before tokenising, a prompt too long for the window whatever its tokens: no token of the model
    holds more than ``max_token_bytes`` bytes and no character fewer than one, so a prompt of more than
    ``window * max_token_bytes`` characters cannot fit. Tokenising 15 MB held the engine 21 s before its 400;
    this check costs one pass over the text."""
    for prompt, where in zip(prompts, names):
        chars = prompt_characters(prompt)
        if chars > window * max_token_bytes:
            raise ContextLengthExceeded(requested=-(-chars // max_token_bytes), available=window, param=where,
                                        lower_bound=f"'{where}' holds {chars} characters, and no token of this "
                                                    f"model holds more than {max_token_bytes} bytes")


def run_each(run: Callable[[Plan, StepControl | None], Iterator[Event]], plans: list[Plan],
             control: StepControl | None = None) -> Iterator[Event]:
    """Decode plans one after another as one stream: choice indices follow on, one Usage at the end."""
    offset, prompt_tokens, completion_tokens = 0, 0, 0
    for plan in plans:
        for event in run(plan, control):
            if isinstance(event, Usage):
                prompt_tokens += event.prompt_tokens
                completion_tokens += event.completion_tokens
            elif isinstance(event, Delta):
                yield Delta(event.index + offset, event.text)
            elif isinstance(event, Finish):
                yield Finish(event.index + offset, event.reason, event.completion_tokens)
            else:
                yield event
        if control is not None and control.cancel.is_set():
            return
        offset += len(plan.prompt_ids) * plan.params.n
    yield Usage(prompt_tokens, completion_tokens)
