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
from millm.structured.tools import Constraint, ToolConstraint, split


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

    def matcher(self, constraint: Constraint) -> Any:
        """A fresh matcher for ``constraint`` (a copy of the cached compiled one)."""
        import llguidance

        key = f"{type(constraint).__name__}:{constraint.key}"
        with self._lock:
            template = self._compiled.get(key)
            if template is None:
                template = llguidance.LLMatcher(self._llg_tokenizer(), constraint.grammar())
                if template.is_error():
                    raise ResponseFormatUnsupported(f"The constraint cannot be compiled: {template.get_error()}",
                                                    param=constraint.param)
                self._compiled[key] = template
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


def validate(constraint: Constraint, text: str) -> None:
    """A closed document must parse and validate (a tool call's arguments against its tool's parameters);
    otherwise 500 constrained_output_invalid."""
    if isinstance(constraint, ToolConstraint):
        content, calls = split(constraint, text)
        for call in calls:
            schema = constraint.schema_of(call.name)
            if schema is None:
                raise ConstrainedOutputInvalid(f"The model called {call.name!r}, which is not among the tools.")
            _validate_json(call.arguments, schema, f"the arguments of {call.name!r}")
        if not calls and constraint.choice != "auto":
            raise ConstrainedOutputInvalid("The model answered without the tool call tool_choice requires.")
        if not calls and constraint.text is not None:
            _validate_json(content, constraint.text.schema, "the answer")
        return
    _validate_json(text, constraint.schema, "the document")


def _validate_json(text: str, schema: dict[str, Any], what: str) -> None:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
        message = exc.msg if isinstance(exc, json.JSONDecodeError) else exc.message
        raise ConstrainedOutputInvalid(f"The model closed {what}, which does not validate: {message}") from None
