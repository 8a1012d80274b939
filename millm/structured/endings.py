"""Where a tool-call answer ends, and what its end is called: two rules on the row's text that the decode loop
asks, read off the grammar ``ToolConstraint.grammar`` builds.

After a call's ``</tool_call>`` that grammar allows the end, with up to ``BLANKS`` blanks first (the model most
often writes a newline there), and, only where several calls are allowed, another call through ``BETWEEN``
(a newline, then ``<tool_call>``). So:

1. **The answer is over once nothing but blanks can follow** (``calls_ended``): right after ``</tool_call>``
   when no further call is allowed (a named ``tool_choice``, ``parallel_tool_calls: false``); with parallel
   calls, once what followed it is blanks that cannot begin ``BETWEEN`` (a second newline, a space). The row
   ends there, without spending its budget on blanks: before, a named call of 40 tokens took 44 (four newlines
   after it, the grammar's limit).
2. **Whole calls are a complete answer** (``calls_complete``): when ``max_tokens`` runs out after every call's
   arguments object closed (what remains of its markup, a brace, a newline and ``</tool_call>``, is fixed
   bytes) and only blanks after the last, the answer ends like one the model ended itself (``finish_reason:
   "tool_calls"``), never ``"length"``: instructor raises ``IncompleteOutputException`` on ``"length"`` whatever
   the arguments. A budget that runs out inside the arguments, or in the marker of another call, is still
   ``"length"``.

The matcher cannot say either: after ``</tool_call>`` it accepts the end but is not stopped (blanks may
follow), and the tokens it allows next can all be blanks even where a newline may still open another call.
"""

from __future__ import annotations

from dataclasses import dataclass

from millm.structured.tools import BETWEEN, BLANKS, CLOSE, TAIL, ToolConstraint

BLANK = " \t\r\n"  # the blanks the grammar allows after the last call


def _blank(text: str) -> bool:
    return not text.strip(BLANK)


def calls_ended(constraint: ToolConstraint, text: str) -> bool:
    """Whether nothing but blanks (or the end) can follow ``text`` under ``constraint``: it holds calls, the last
    one's markup closed, and what followed it is blanks that cannot begin another call (any, where no further
    call is allowed). Texts that do not end in ``</tool_call>`` and at most ``BLANKS`` blanks are answered
    without parsing them (the rule is asked after every token)."""
    end = text[-(len(CLOSE) + BLANKS):]
    stripped = end.rstrip(BLANK)
    if not stripped.endswith(CLOSE) or len(end) - len(stripped) > BLANKS:
        return False
    parser = constraint.parser()
    parser.feed(text)
    if not parser.calls or parser.state != "between" or not _blank(parser.held):
        return False
    return not (constraint.several and BETWEEN.startswith(parser.held))


def calls_complete(constraint: ToolConstraint, text: str) -> bool:
    """Whether ``text``, generated under ``constraint``, is a complete answer though the budget ran out: at
    least one call, each call's arguments object closed, and only blanks after the last (a budget that runs
    out in a call's arguments, or in the next call's marker, leaves it incomplete; so does text without a
    call)."""
    parser = constraint.parser()
    parser.feed(text)
    if not parser.calls:
        return False
    if parser.state == "tail":  # the arguments closed; the rest of the call's markup is fixed
        return TAIL.startswith(parser.held)
    return parser.state == "between" and _blank(parser.held)


@dataclass(frozen=True)
class CallEndings:
    """The two rules for one row's constraint, as the decode loop asks them: ``ended`` after every token (the
    row ends "stop" when it says so), ``complete`` when the budget runs out ("stop" rather than "length")."""

    constraint: ToolConstraint

    def ended(self, text: str) -> bool:
        return calls_ended(self.constraint, text)

    def complete(self, text: str) -> bool:
        return calls_complete(self.constraint, text)


def endings(constraint: object) -> CallEndings | None:
    """The ending rules of a row under ``constraint``: a tool constraint's; None for anything else (a JSON
    document ends when its matcher stops, and one the budget cut is incomplete)."""
    return CallEndings(constraint) if isinstance(constraint, ToolConstraint) else None
