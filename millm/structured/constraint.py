"""Enforcing a JSON constraint token by token with llguidance (the outlines backend that enforces
miLLM's whole subset), and validating the closed document with jsonschema.

Measured choice: outlines-core's regex compiler accepts ``minimum``/``maximum`` but drops them, so a
schema asking for 5-10 could yield 17; llguidance masks such tokens while generating. The grammar is
``millm.structured.schema.grammar_of``, the one the request was checked against before generating.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import torch

from millm.errors import ConstrainedOutputInvalid, ResponseFormatUnsupported
from millm.structured.schema import PARAM, JsonConstraint, grammar_of


class ConstraintCompiler:
    """Compiled constraints for one tokenizer, cached by schema: the same schema compiles once."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._lltokenizer: Any = None
        self._compiled: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.compiles = 0

    def _llg_tokenizer(self) -> Any:
        if self._lltokenizer is None:
            import llguidance.hf

            self._lltokenizer = llguidance.hf.from_tokenizer(self.tokenizer)
        return self._lltokenizer

    def matcher(self, constraint: JsonConstraint) -> Any:
        """A fresh matcher for ``constraint`` (a copy of the cached compiled one)."""
        import llguidance

        with self._lock:
            template = self._compiled.get(constraint.key)
            if template is None:
                template = llguidance.LLMatcher(self._llg_tokenizer(), grammar_of(constraint.key))
                if template.is_error():
                    raise ResponseFormatUnsupported(f"The schema cannot be compiled: {template.get_error()}",
                                                    param=PARAM)
                self._compiled[constraint.key] = template
                self.compiles += 1
            return template.deep_copy()


class RowGuides:
    """One matcher per generated row: masks the logits before sampling, advances on each token."""

    def __init__(self, matchers: list[Any], vocab_size: int) -> None:
        import llguidance.torch

        self.matchers = matchers
        self.bitmask = llguidance.torch.allocate_token_bitmask(len(matchers), vocab_size)

    def mask(self, logits: torch.Tensor, active: list[bool]) -> torch.Tensor:
        """Disallowed tokens to -inf, in place, for the rows still generating."""
        import llguidance.torch

        for i, matcher in enumerate(self.matchers):
            if active[i]:
                llguidance.torch.fill_next_token_bitmask(matcher, self.bitmask, i)
        llguidance.torch.apply_token_bitmask_inplace(logits, self.bitmask.to(logits.device))
        return logits

    def advance(self, row: int, token: int) -> bool:
        """Consume ``token`` for ``row``; True once the document is closed."""
        matcher = self.matchers[row]
        matcher.consume_token(token)
        return matcher.is_stopped()


def validate(constraint: JsonConstraint, text: str) -> None:
    """A closed document must parse and validate; otherwise 500 constrained_output_invalid."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), constraint.schema)
    except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
        message = exc.msg if isinstance(exc, json.JSONDecodeError) else exc.message
        raise ConstrainedOutputInvalid(f"The model closed a document that does not validate: {message}") from None
