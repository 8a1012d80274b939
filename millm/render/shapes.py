"""OpenAI response bodies for chat and text completions, whole and streamed."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from millm.engine.events import Usage


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

    def __post_init__(self) -> None:
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def whole(self, texts: dict[int, str], finishes: dict[int, str], usage: Usage) -> dict[str, Any]:
        """The non-streamed response."""
        choices = []
        for i in sorted(finishes):
            choice: dict[str, Any] = {"index": i}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": texts.get(i, "")}
            else:
                choice["text"] = texts.get(i, "")
            choices.append({**choice, "logprobs": None, "finish_reason": finishes[i]})
        body = self._envelope("chat.completion" if self.chat else "text_completion", choices)
        return {**body, "system_fingerprint": self.fingerprint, "usage": usage_body(usage)}

    def chunk(self, index: int, text: str | None = None, finish: str | None = None, *, role: bool = False,
              usage: Usage | None = None) -> dict[str, Any]:
        """One streamed chunk for choice ``index``: a role opener, a text delta or a finish."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
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
