"""OpenAI response bodies for chat and text completions, whole and streamed."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from millm.engine.events import Usage
from millm.steering.readout import LabelSource, asks_labels, with_labels
from millm.structured.tools import ToolConstraint, split

if TYPE_CHECKING:
    from millm.requests.builder import Built


def call_finish(reason: str) -> str:
    """A row that ended itself ("stop") after calling tools finishes with "tool_calls"; "length" stays."""
    return "tool_calls" if reason == "stop" else reason


def usage_body(usage: Usage) -> dict[str, int]:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens}


@dataclass
class CompletionShape:
    """Builds one response's bodies; ``chat`` picks chat.completion over text_completion."""

    chat: bool
    model: str
    fingerprint: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    constraint: Any = None  # the request's constraint: a ToolConstraint's text is rendered as content and tool_calls
    readout_labels: LabelSource | None = None  # where the read-out's labels come from, when its ask has labels

    @property
    def tools(self) -> ToolConstraint | None:
        """The tool-call constraint whose text this response renders as calls (chat only)."""
        return self.constraint if self.chat and isinstance(self.constraint, ToolConstraint) else None

    def __post_init__(self) -> None:
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex

    @classmethod
    def of(cls, built: Built, fingerprint: str, labels: LabelSource | None = None) -> CompletionShape:
        """The shape of ``built``'s response: its route, the model name it asked for, its constraint (a
        tool-call constraint's text renders as content and tool_calls), and, when its return_sae_activations
        asks for labels, ``labels`` to read them from (the SAE registry's; none given: every label is null)."""
        ask = built.score.readout if built.score is not None else next(
            (g.readout for g in built.generations if g.readout is not None), None)
        source = (labels or (lambda _: {})) if asks_labels(ask) else None
        return cls(chat=built.route == "chat", model=built.model, fingerprint=fingerprint, constraint=built.constraint,
                   readout_labels=source)

    def sae_activations(self, body: dict[str, Any]) -> dict[str, Any]:
        """The read-out as the response carries it: with each feature's label when the ask has labels."""
        return body if self.readout_labels is None else with_labels(body, self.readout_labels(body["sae_id"]))

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def whole(self, texts: dict[int, str], finishes: dict[int, str], usage: Usage) -> dict[str, Any]:
        """The non-streamed response."""
        choices = []
        for i in sorted(finishes):
            choice: dict[str, Any] = {"index": i}
            finish = finishes[i]
            if self.tools is not None:
                content, calls = split(self.tools, texts.get(i, ""))
                choice["message"] = {"role": "assistant", "content": content or (None if calls else "")}
                if calls:
                    choice["message"]["tool_calls"] = [c.openai() for c in calls]
                    finish = call_finish(finish)
            elif self.chat:
                choice["message"] = {"role": "assistant", "content": texts.get(i, "")}
            else:
                choice["text"] = texts.get(i, "")
            choices.append({**choice, "logprobs": None, "finish_reason": finish})
        body = self._envelope("chat.completion" if self.chat else "text_completion", choices)
        return {**body, "system_fingerprint": self.fingerprint, "usage": usage_body(usage)}

    def chunk(self, index: int, text: str | None = None, finish: str | None = None, *, role: bool = False,
              usage: Usage | None = None, tool_call: dict[str, Any] | None = None) -> dict[str, Any]:
        """One streamed chunk for choice ``index``: a role opener, a text delta, a tool-call delta or a finish."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            if tool_call is not None:
                delta["tool_calls"] = [tool_call]
            choice: dict[str, Any] = {"index": index, "delta": delta}
        else:
            choice = {"index": index, "text": text or ""}
        choice.update(logprobs=None, finish_reason=finish)
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [choice])
        if usage is not None:
            body["usage"] = usage_body(usage)
        return body

    def extension(self, millm: dict[str, Any]) -> dict[str, Any]:
        """The final streamed chunk carrying miLLM's own object (choices empty)."""
        return {**self._envelope("chat.completion.chunk" if self.chat else "text_completion", []), "millm": millm}
