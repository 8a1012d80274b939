"""Enforcing a JSON constraint token by token with llguidance (the outlines backend that enforces
miLLM's whole subset), and validating the closed document with jsonschema.

Measured choice: outlines-core's regex compiler accepts ``minimum``/``maximum`` but drops them, so a
schema asking for 5-10 could yield 17; llguidance masks such tokens while generating. The grammar is
``millm.structured.schema.grammar_of``, the one the request was checked against before generating.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

import torch

from millm.errors import ConstrainedOutputInvalid, ResponseFormatUnsupported
from millm.structured.bounded import BoundedCache
from millm.structured.schema import linear_regex
from millm.structured.tools import OPEN, Constraint, ToolConstraint, split

COMPILED_MAX = 64  # compiled constraints kept per engine
COMPILED_MAX_BYTES = 256 * 2**20  # and the memory they may hold, as ``compiled_bytes`` estimates it
COMPILED_BASE_BYTES = 2**20  # what one compiled constraint holds whatever its grammar (measured: bench/caches.py)
COMPILED_BYTES_PER_CHAR = 64  # and what each character of its grammar adds


def compiled_bytes(key: str, _: Any) -> int:
    """The memory a compiled constraint holds, estimated from its grammar's size (llguidance does not say)."""
    return COMPILED_BASE_BYTES + COMPILED_BYTES_PER_CHAR * len(key)


class ConstraintCompiler:
    """Compiled constraints for one tokenizer, cached by schema (bounded: a client sending a new schema with
    every request cannot grow the server): a schema a judge repeats compiles once."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._lltokenizer: Any = None
        self._compiled: BoundedCache[str, Any] = BoundedCache(COMPILED_MAX, COMPILED_MAX_BYTES, compiled_bytes)
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
                self._compiled.put(key, template)
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


def stop_scope(constraint: Constraint | None, stops: Sequence[str]) -> tuple[tuple[str, ...], str | None]:
    """The stop sequences that apply to a row under ``constraint``, and the text before which they apply (None:
    all of it). A tool call is never cut: stops apply to an "auto" answer's free text before its first call
    marker, and not at all where the text is calls alone. (A document of response_format with stop is refused
    before this: the builder's rule.)"""
    if isinstance(constraint, ToolConstraint):
        return (tuple(stops) if constraint.free_text else ()), OPEN
    return tuple(stops), None


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
    """``text`` parses and validates against ``schema``, in time linear in the text: ``pattern`` is matched by
    RE2 (Python's backtracking ``re`` took 42 s over 30 characters for ``(a+)+c``, holding the interpreter
    lock, so every route waited), and a document nested deeper than Python's validator can follow is
    refused as such rather than crashing it."""
    import jsonschema

    if (depth := nesting(text)) > MAX_VALIDATED_DEPTH:
        raise ConstrainedOutputInvalid(f"The model closed {what} nested {depth} levels deep; miLLM validates "
                                       f"documents up to {MAX_VALIDATED_DEPTH} levels.")
    try:
        validator = linear_validator()(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        error = jsonschema.exceptions.best_match(validator.iter_errors(json.loads(text)))
    except json.JSONDecodeError as exc:
        raise ConstrainedOutputInvalid(f"The model closed {what}, which does not validate: {exc.msg}") from None
    if error is not None:
        raise ConstrainedOutputInvalid(f"The model closed {what}, which does not validate: {error.message}")


MAX_VALIDATED_DEPTH = 200  # nesting a closed document may have for jsonschema's recursion (measured: 1000 fails)


def nesting(text: str) -> int:
    """How deeply ``text``'s JSON arrays and objects nest (brackets inside strings not counted); one pass."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def re2_pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Any:
    """JSON Schema's ``pattern`` (a search, not anchored) matched by RE2, which never backtracks."""
    import jsonschema

    if validator.is_type(instance, "string") and linear_regex(pattern).search(instance) is None:
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_LINEAR: Any = None


def linear_validator() -> Any:
    """Draft 2020-12 with ``pattern`` checked by RE2 (built once)."""
    global _LINEAR
    if _LINEAR is None:
        import jsonschema

        _LINEAR = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": re2_pattern})
    return _LINEAR
