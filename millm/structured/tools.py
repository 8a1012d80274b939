"""Tool calling as a constraint: ``tools`` and ``tool_choice`` checked, compiled into one grammar (plain text
or one or more tool calls whose arguments satisfy each tool's ``parameters``), and the generated text split
back into content and calls.

The engine only sees a constraint (``ToolConstraint``) and text; OpenAI's shapes (``message.tool_calls``,
``delta.tool_calls``, ``finish_reason: "tool_calls"``) are made from that text at render time
(``millm.render``) by ``ToolCallParser``. A call is written in the Hermes/Qwen markup that chat templates
with tool support were trained on::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The grammar fixes every byte of that wrapper, so the parser never guesses: the name is always first, the
arguments are one JSON object, and calls follow one another separated by a newline. After a complete call
the model may also end, with up to ``BLANKS`` whitespace characters first: a newline after ``</tool_call>`` is
what the model most often writes there (0.66 against 0.28 for the end), and it must not commit it to a second
call.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from millm.errors import InvalidParameter
from millm.sfv import sf_string
from millm.structured.bounded import bounded
from millm.structured.schema import OMITTED, WHITESPACE, JsonConstraint, canonical, check_schema, closed

TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for function names
MAX_TOOLS = 128  # OpenAI's limit
OPEN, CLOSE = "<tool_call>", "</tool_call>"
HEAD = '\n{"name": "'  # after OPEN, before the name
MID = '", "arguments": '  # after the name, before the arguments object
TAIL = "}\n" + CLOSE  # after the arguments object
BETWEEN = "\n" + OPEN  # from one call's TAIL to the next call's HEAD
BLANKS = 4  # whitespace characters the model may write after its last call before it ends (a newline, mostly)
CHOICES = ("auto", "required")
TOOL_KEYS = {"type", "function"}
FUNCTION_KEYS = {"name", "description", "parameters", "strict"}
# the parse's states that expect a fixed literal of the markup: the literal, and the state after it
LITERALS = {"head": (HEAD, "name"), "mid": (MID, "args"), "tail": (TAIL, "between"), "between": (BETWEEN, "head")}


def call_text(name: str, arguments: str) -> str:
    """One call in the markup the grammar enforces (how a call in the history is shown to the model too)."""
    return f"{OPEN}{HEAD}{name}{MID}{arguments}{TAIL}"


@dataclass(frozen=True)
class Tool:
    """One function the model may call: its name, description and the schema its arguments must satisfy."""

    name: str
    description: str | None
    parameters: dict[str, Any]

    def openai(self) -> dict[str, Any]:
        """The tool as a chat template (and the generic tool prompt) receives it."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolConstraint:
    """Text or tool calls: ``choice`` auto (text, or text then calls), required (one or more calls) or
    function (exactly one call of ``forced``); ``parallel`` false allows one call at most; ``text`` is a
    response_format the text answer must satisfy (then a call, if any, comes first and alone); ``undeclared``
    as a ``JsonConstraint``'s, for each tool's arguments."""

    tools: tuple[Tool, ...]
    choice: str = "auto"
    forced: str | None = None
    parallel: bool = True
    text: JsonConstraint | None = None
    undeclared: str = "omit"
    param = "tools"

    @property
    def key(self) -> str:
        """Everything the grammar depends on: the cache key of its compiled constraint."""
        return json.dumps({"tools": [[t.name, canonical(t.parameters)] for t in self.tools], "choice": self.choice,
                           "forced": self.forced, "parallel": self.parallel, "undeclared": self.undeclared,
                           "text": None if self.text is None else self.text.key}, separators=(",", ":"))

    def header(self) -> str:
        """X-miLLM-Constrained: ``tools;choice="auto"`` (with ``;name=`` for a forced function and
        ``;response_format=`` the text's own constraint, ``;undeclared=omitted`` when a tool's arguments are
        generated ``closed``)."""
        value = f"tools;choice={sf_string(self.choice)}"
        if self.forced is not None:
            value += f";name={sf_string(self.forced)}"
        if any(self.arguments_schema(t) != t.parameters for t in self.callable()):
            value += OMITTED
        if self.text is not None:
            value += f";response_format={sf_string(self.text.header())}"
        return value

    def prompt_tools(self) -> list[dict[str, Any]]:
        """The tools the model is told about: every tool, or only the forced one."""
        return [t.openai() for t in self.tools if self.forced is None or t.name == self.forced]

    def callable(self) -> tuple[Tool, ...]:
        return tuple(t for t in self.tools if self.forced is None or t.name == self.forced)

    def arguments_schema(self, tool: Tool) -> dict[str, Any]:
        """The schema a call's arguments are generated by (validation reads ``parameters``)."""
        return closed(tool.parameters) if self.undeclared == "omit" else tool.parameters

    def schema_of(self, name: str) -> dict[str, Any] | None:
        return next((t.parameters for t in self.tools if t.name == name), None)

    @property
    def free_text(self) -> bool:
        """Whether plain text may come before the calls (``auto`` without a response_format): the grammar's
        lead, and the only text stop sequences apply to."""
        return self.choice == "auto" and self.text is None

    @property
    def several(self) -> bool:
        """Whether another call may follow a call (not with a named function or parallel_tool_calls false)."""
        return self.parallel and self.forced is None

    def parser(self) -> ToolCallParser:
        """A parser for a row's text under this constraint: a call may follow text only under "auto" without a
        response_format, and under "required" or a forced function the text is calls alone."""
        return ToolCallParser(lead=self.text is None, calls_only=self.choice != "auto")

    def grammar(self) -> str:
        """The Lark grammar (llguidance's dialect): every byte of the call wrapper fixed, each tool's
        arguments an inline JSON schema with miLLM's whitespace rule."""
        lit = json.dumps  # a JSON string literal is a Lark string literal
        rules = ["%llguidance {}"]
        if self.free_text:
            # text without the call marker; or text up to the marker (a lazy lexeme ends there), then the calls
            rules += ["start: TEXT | lead calls", "TEXT: /(?s:.*)/ & ~/(?s:.*)<tool_call>(?s:.*)/",
                      "lead[lazy]: /(?s:.*)<tool_call>/"]
        elif self.choice == "auto":
            assert self.text is not None
            rules += [f"start: answer | {lit(OPEN)} calls", f"answer: %json {_inline(self.text.generated)}"]
        else:
            rules += [f"start: {lit(OPEN)} calls"]
        rules += [f"calls: call ({lit(BETWEEN)} call)* END?" if self.several else "calls: call END?",
                  f"END: /[ \\t\\r\\n]{{1,{BLANKS}}}/"]
        tools = self.callable()
        rules += [f"call: {lit(HEAD)} ({' | '.join(f'fn{i}' for i in range(len(tools)))}) {lit(TAIL)}"]
        for i, tool in enumerate(tools):
            rules += [f"fn{i}: {lit(tool.name + MID)} args{i}",
                      f"args{i}: %json {_inline(self.arguments_schema(tool))}"]
        return "\n".join(rules)


def _inline(schema: dict[str, Any]) -> str:
    """An inline schema for the grammar, with miLLM's whitespace rule (at most one space between tokens)."""
    return json.dumps({**schema, "x-guidance": {"whitespace_pattern": WHITESPACE}})


def _where(i: int, *rest: str) -> str:
    return ".".join([f"tools[{i}]", *rest])


def _parameters(raw: Any, where: str) -> dict[str, Any]:
    """A tool's parameters: a JSON Schema for an object (absent or ``{}``: any object), in miLLM's subset."""
    if raw is None or raw == {}:
        return {"type": "object"}
    if not isinstance(raw, dict):
        raise InvalidParameter(f"'{where}' must be a JSON Schema object.", param=where)
    kind = raw.get("type", "object")
    if kind != "object":
        raise InvalidParameter(f"'{where}' must describe an object (arguments are a JSON object), got type {kind!r}.",
                               param=where)
    schema = {"type": "object", **raw}
    check_schema(schema, where, InvalidParameter)
    return schema


def _tool_function(i: int, raw: Any) -> dict[str, Any]:
    """``tools[i]``'s ``function`` object, the tool checked to be ``{"type": "function", "function": {...}}``."""
    if not isinstance(raw, dict) or raw.get("type") != "function":
        raise InvalidParameter(f"'{_where(i)}' must be an object with \"type\": \"function\".", param=_where(i))
    function = raw.get("function")
    if not isinstance(function, dict):
        raise InvalidParameter(f"'{_where(i, 'function')}' must be an object.", param=_where(i, "function"))
    return function


def _tool_name(i: int, function: dict[str, Any], tools: list[Tool]) -> str:
    """``tools[i]``'s function name: by OpenAI's rule, and no earlier tool's."""
    name = function.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise InvalidParameter(f"'{_where(i, 'function', 'name')}' must be 1-64 letters, digits, '_' or '-' "
                               "(as OpenAI's API requires).", param=_where(i, "function", "name"))
    if any(t.name == name for t in tools):
        raise InvalidParameter(f"'{_where(i, 'function', 'name')}': two tools are named {name!r}.",
                               param=_where(i, "function", "name"))
    return name


def _check_tool(i: int, raw: Any, tools: list[Tool]) -> Tool:
    """``tools[i]`` checked (``tools`` are the ones before it, whose names it must not repeat)."""
    function = _tool_function(i, raw)
    name = _tool_name(i, function, tools)
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidParameter(f"'{_where(i, 'function', 'description')}' must be a string.",
                               param=_where(i, "function", "description"))
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidParameter(f"'{_where(i, 'function', 'strict')}' must be true or false.",
                               param=_where(i, "function", "strict"))
    return Tool(name, description, _parameters(function.get("parameters"), _where(i, "function", "parameters")))


def check_tools(value: Any) -> tuple[Tool, ...]:
    """``tools``: a list of ``{"type": "function", "function": {"name", "description"?, "parameters"?,
    "strict"?}}`` with distinct names (strict false is accepted; arguments are enforced either way)."""
    if not isinstance(value, list):
        raise InvalidParameter("'tools' must be a list of tool objects.", param="tools")
    if len(value) > MAX_TOOLS:
        raise InvalidParameter(f"'tools' holds {len(value)} tools; at most {MAX_TOOLS}.", param="tools")
    tools: list[Tool] = []
    for i, raw in enumerate(value):
        tools.append(_check_tool(i, raw, tools))
    return tuple(tools)


def _unread_keys(i: int, raw: dict[str, Any]) -> list[str]:
    """The keys of ``tools[i]`` and of its function object that nothing reads (null ones are not reported)."""
    found = [f"tools[{i}].{k}" for k, v in raw.items() if k not in TOOL_KEYS and v is not None]
    if isinstance(raw.get("function"), dict):
        found += [f"tools[{i}].function.{k}" for k, v in raw["function"].items()
                  if k not in FUNCTION_KEYS and v is not None]
    return found


def tool_locations(value: Any) -> list[str]:
    """Keys of the tool objects that nothing reads (reported like any unused field)."""
    if not isinstance(value, list):
        return []
    return [key for i, raw in enumerate(value) if isinstance(raw, dict) for key in _unread_keys(i, raw)]


def _choice(choice_value: Any) -> str:
    """``tool_choice`` given as a string or left out: auto, none or required."""
    if choice_value is None:
        return "auto"
    if not isinstance(choice_value, str):
        raise InvalidParameter("'tool_choice' must be a string or an object.", param="tool_choice")
    if choice_value not in (*CHOICES, "none"):
        raise InvalidParameter("'tool_choice' must be auto, none, required or {\"type\": \"function\", "
                               f"\"function\": {{\"name\": ...}}}}, got {choice_value!r}.", param="tool_choice")
    return choice_value


def _forced(choice_value: dict[str, Any], tools: tuple[Tool, ...]) -> str:
    """The name ``tool_choice`` given as an object forces: ``{"type": "function", "function": {"name": ...}}``,
    the name one of ``tools``."""
    function = choice_value.get("function")
    if choice_value.get("type") != "function" or not isinstance(function, dict) \
            or not isinstance(function.get("name"), str):
        raise InvalidParameter("'tool_choice' as an object must be {\"type\": \"function\", \"function\": "
                               "{\"name\": ...}}.", param="tool_choice")
    forced: str = function["name"]
    if not any(t.name == forced for t in tools):
        raise InvalidParameter(f"'tool_choice' names {forced!r}, which is not among 'tools'.",
                               param="tool_choice.function.name")
    return forced


def tool_constraint(tools_value: Any, choice_value: Any, parallel: Any = None,
                    text: JsonConstraint | None = None, undeclared: str = "omit") -> ToolConstraint | None:
    """The constraint ``tools``/``tool_choice``/``parallel_tool_calls`` ask for; None when no tool may be called
    (no tools, or tool_choice "none": the answer is text, constrained by ``text`` alone); ``undeclared`` is
    MILLM_UNDECLARED_PROPERTIES."""
    if parallel is not None and not isinstance(parallel, bool):
        raise InvalidParameter("'parallel_tool_calls' must be true or false.", param="parallel_tool_calls")
    tools = check_tools(tools_value) if tools_value is not None else ()
    if isinstance(choice_value, dict):
        if not tools:  # no tool to check the object against, none to call
            return None
        choice, forced = "function", _forced(choice_value, tools)
    else:
        choice, forced = _choice(choice_value), None
    if choice == "none" or not tools:  # nothing to call: the field table reports tool_choice on such a request
        return None
    constraint = ToolConstraint(tools, choice, forced, parallel is not False, text, undeclared)
    if problem := _grammar_problem(constraint.grammar()):  # before anything generates, not as a 500 after
        raise InvalidParameter(f"The tools cannot be compiled into one constraint: {problem}", param="tools")
    return constraint


@bounded(max_entries=256, max_bytes=32 * 2**20)
def _grammar_problem(grammar: str) -> str | None:
    import llguidance

    try:
        error = llguidance.LLMatcher.validate_grammar(grammar)
    except ValueError as exc:
        error = str(exc)
    return error or None


Constraint = JsonConstraint | ToolConstraint


def _check_calls(calls: Any, where: str) -> None:
    """An assistant message's ``tool_calls`` (the message is ``where``): a list of calls, each naming a function
    and giving its arguments as JSON text or an object."""
    if not isinstance(calls, list):
        raise InvalidParameter(f"'{where}.tool_calls' must be a list of calls.", param=f"{where}.tool_calls")
    for j, call in enumerate(calls):
        here = f"{where}.tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidParameter(f"'{here}' must be {{\"type\": \"function\", \"function\": {{\"name\", "
                                   "\"arguments\"}}.", param=here)
        if not isinstance(function.get("arguments", "{}"), (str, dict)):
            raise InvalidParameter(f"'{here}.function.arguments' must be a JSON string.",
                                   param=f"{here}.function.arguments")


def _check_result(message: dict[str, Any], where: str) -> None:
    """A tool (or legacy function) message's ``tool_call_id`` and ``name``: strings when given."""
    if message.get("role") not in ("tool", "function"):
        return
    for key in ("tool_call_id", "name"):
        if not isinstance(message.get(key, ""), (str, type(None))):
            raise InvalidParameter(f"'{where}.{key}' must be a string.", param=f"{where}.{key}")


def check_tool_history(messages: list[dict[str, Any]], name: str = "messages") -> list[dict[str, Any]]:
    """Calls and results in a conversation's history, checked: an assistant's ``tool_calls`` is a list of
    ``{"id"?, "type"?: "function", "function": {"name", "arguments": JSON text or object}}``; a tool message's
    ``tool_call_id`` and ``name`` are strings."""
    for i, message in enumerate(messages):
        where = f"{name}[{i}]"
        calls = message.get("tool_calls")
        if calls is not None and message.get("role") == "assistant":
            _check_calls(calls, where)
        _check_result(message, where)
    return messages


# rendering: the generated text back into content and calls
@dataclass
class Piece:
    """A piece of a tools-constrained row's text: ``content``, a ``call`` opening (its name), or a run of
    the call's ``arguments``."""

    kind: str
    text: str
    call: int = 0


@dataclass
class Call:
    id: str
    name: str
    arguments: str = ""

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class ToolCallParser:
    """Splits a tools-constrained row's text, as it streams, into content and calls. Text that could still
    become the call marker is held back until it does or cannot. With ``lead`` false (a response_format answer
    beside the tools), a call can only open the text; with ``calls_only`` (a call is required) there is no
    text at all, so marker text held back when the row ends (cut by max_tokens inside it) is dropped."""

    lead: bool = True
    calls_only: bool = False
    calls: list[Call] = field(default_factory=list)
    _buffer: str = ""
    _state: str = "content"  # content | text (no call can follow) | head | name | mid | args | tail | between
    _depth: int = 0
    _string: bool = False
    _escape: bool = False

    def feed(self, text: str) -> list[Piece]:
        self._buffer += text
        out: list[Piece] = []
        while self._step(out):
            pass
        return out

    def close(self) -> list[Piece]:
        """The end of the row: held-back text is content after all (a call cut short stays as it is)."""
        out: list[Piece] = []
        held = self._state == "text" or (self._state == "content" and not self.calls_only)
        if held and self._buffer:
            out.append(Piece("content", self._buffer))
        self._buffer = ""
        return out

    @property
    def state(self) -> str:
        """Where the parse stands: ``tail`` once a call's arguments object closed, ``between`` once its markup
        closed (another call or the end may follow); ``millm.structured.endings`` reads it."""
        return self._state

    @property
    def held(self) -> str:
        """The text held back where the parse stands (after a closed call: what followed it)."""
        return self._buffer

    def _expect(self, literal: str, then: str) -> bool:
        if len(self._buffer) < len(literal):
            return False
        if not self._buffer.startswith(literal):  # never under the grammar; shown as it is rather than lost
            self._state = "text"
            return True
        self._buffer = self._buffer[len(literal):]
        self._state = then
        return True

    def _step(self, out: list[Piece]) -> bool:
        """One move of the parse over the held text, its pieces appended to ``out``; whether another may follow
        without more text."""
        if not self._buffer:
            return False
        if self._state in LITERALS:
            return self._expect(*LITERALS[self._state])
        if self._state == "text":
            out.append(Piece("content", self._buffer))
            self._buffer = ""
            return False
        if self._state == "content":
            return self._content(out)
        if self._state == "name":
            return self._name(out)
        if self._state == "args":
            return self._arguments(out)
        return False

    def _content(self, out: list[Piece]) -> bool:
        """Content up to the call marker (then ``head``); text that could still become the marker is held back.
        Without ``lead`` the marker counts only at the start, and text that cannot begin it is ``text`` for good."""
        buf = self._buffer
        at = buf.find(OPEN)
        if at >= 0 and (self.lead or at == 0):
            if at:
                out.append(Piece("content", buf[:at]))
            self._buffer = buf[at + len(OPEN):]
            self._state = "head"
            return True
        keep = _partial_suffix(buf, OPEN)
        if not self.lead and not OPEN.startswith(buf):
            keep, self._state = 0, "text"
        if len(buf) > keep:
            out.append(Piece("content", buf[:len(buf) - keep]))
            self._buffer = buf[len(buf) - keep:]
        return self._state == "text" and bool(self._buffer)

    def _name(self, out: list[Piece]) -> bool:
        """A call's name, once its closing quote has come: a new call (then ``mid``)."""
        buf = self._buffer
        end = buf.find('"')
        if end < 0:
            return False
        self.calls.append(Call(call_id(), buf[:end]))
        out.append(Piece("call", buf[:end], len(self.calls) - 1))
        self._buffer = buf[end:]
        self._state = "mid"
        return True

    def _arguments(self, out: list[Piece]) -> bool:
        """A run of the call's arguments object, up to its closing brace (then ``tail``)."""
        buf = self._buffer
        taken = self._scan(buf)
        if taken:
            self.calls[-1].arguments += buf[:taken]
            out.append(Piece("arguments", buf[:taken], len(self.calls) - 1))
            self._buffer = buf[taken:]
        return self._state == "tail"

    def _scan(self, text: str) -> int:
        """How much of ``text`` belongs to the arguments object (it ends where its outer brace closes)."""
        for i, ch in enumerate(text):
            if self._string:
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._string = False
            elif ch == '"':
                self._string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._state = "tail"
                    return i + 1
        return len(text)


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def split(constraint: ToolConstraint, text: str) -> tuple[str, list[Call]]:
    """A whole row's text: its content and its calls."""
    parser = constraint.parser()
    pieces = parser.feed(text) + parser.close()
    return "".join(p.text for p in pieces if p.kind == "content"), parser.calls
