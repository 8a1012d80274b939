"""Rendering chat messages into the text the model reads."""

from __future__ import annotations

import json
from typing import Any

from millm.structured.tools import call_text

# chat templates' end-of-turn markers: generation stops on them like on EOS (both engines)
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>")

FALLBACK_NAMES = {"system": "System", "user": "User", "assistant": "Assistant",
                  "tool": "Tool", "function": "Function", "developer": "Developer"}


TOOLS_KWARG = "tools"  # in a ChatPrompt's template_kwargs: the tools offered (OpenAI tool objects), set by the builder

# the generic tool prompt (for templates without tool support): Hermes/Qwen's wording, in the markup the
# tool-call grammar enforces (millm.structured.tools)
TOOLS_SYSTEM = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n"
                "</tools>\n\nFor each function call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
                "<args-json-object>}}\n</tool_call>")
TOOL_RESPONSE = "<tool_response>\n{content}\n</tool_response>"


def fallback_template(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    """A plain 'Role: text' transcript for models that ship no chat template."""
    text = "".join(f"{FALLBACK_NAMES[m['role']]}: {m['content']}\n\n" for m in messages)
    return text + ("Assistant:" if add_generation_prompt else "")


def native_tools(tokenizer: Any) -> bool:
    """Whether the model's own template renders tools, calls and results in the markup miLLM enforces
    (Hermes/Qwen ``<tool_call>``): then it gets ``tools=`` and the messages as they are."""
    template = getattr(tokenizer, "chat_template", None)
    texts = list(template.values()) if isinstance(template, dict) else [template or ""]
    return any("<tool_call>" in t and "tools" in t for t in texts)


def _arguments(raw: Any) -> Any:
    """A call's arguments as templates expect them (an object; OpenAI sends a JSON string)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def _native(message: dict[str, Any]) -> dict[str, Any]:
    if not message.get("tool_calls"):
        return message
    calls = [{**c, "function": {**c["function"], "arguments": _arguments(c["function"].get("arguments"))}}
             for c in message["tool_calls"]]
    return {**message, "tool_calls": calls}


def _call_markup(call: dict[str, Any]) -> str:
    arguments = call["function"].get("arguments")
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return call_text(call["function"]["name"], text)


def _add_result(out: list[dict[str, Any]], content: str) -> None:
    """A tool result as a ``<tool_response>`` block: joined to the user turn of results just before it, else a new
    user turn of results."""
    block = TOOL_RESPONSE.format(content=content)
    if out and out[-1].get("tool_results"):
        out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + block}
    else:
        out.append({"role": "user", "content": block, "tool_results": True})


def _plain_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as role and content alone: each assistant call as its markup after the content, tool
    results as user turns of ``<tool_response>`` blocks."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            out.append({"role": "assistant", "content": content + "\n".join(_call_markup(c) for c in m["tool_calls"])})
        elif role in ("tool", "function"):
            _add_result(out, content)
        else:
            out.append({"role": role, "content": content})
    return [{"role": m["role"], "content": m["content"]} for m in out]


def _with_tool_listing(turns: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``turns`` with the tools listed in the system message: after the conversation's own, else in a new one."""
    listing = TOOLS_SYSTEM.format(tools="\n".join(json.dumps(t) for t in tools))
    if turns and turns[0]["role"] == "system":
        return [{"role": "system", "content": turns[0]["content"] + "\n\n" + listing}, *turns[1:]]
    return [{"role": "system", "content": listing}, *turns]


def generic_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Tools, calls and results as plain turns for a template without tool support: the tools in the system
    message, each call in the history as the markup the model is constrained to write, and tool results as a
    user turn of ``<tool_response>`` blocks (consecutive results in one turn)."""
    turns = _plain_turns(messages)
    return _with_tool_listing(turns, tools) if tools else turns


def _apply(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool,
           template_kwargs: dict[str, Any]) -> str:
    kwargs = dict(template_kwargs)
    tools = kwargs.pop(TOOLS_KWARG, None)
    if getattr(tokenizer, "chat_template", None):
        if native_tools(tokenizer):
            messages = [_native(m) for m in messages]
            if tools:
                kwargs["tools"] = tools
        else:
            messages = generic_messages(messages, tools)
        return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False,
                                             **kwargs)
    return fallback_template(generic_messages(messages, tools), add_generation_prompt)


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], template_kwargs: dict[str, Any] | None = None) -> str:
    """The prompt text for ``messages`` (already validated, content as plain strings).

    A trailing assistant message is a partial answer to continue, not a turn to close: everything
    before it is rendered with the generation prompt and the partial is appended raw, so the model
    resumes mid-sentence instead of starting a new answer. ``template_kwargs`` are extra variables
    for the model's own template (``enable_thinking``, say).
    """
    kwargs = template_kwargs or {}
    if messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls"):
        return _apply(tokenizer, messages[:-1], True, kwargs) + messages[-1]["content"]
    return _apply(tokenizer, messages, True, kwargs)


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the model ships its own chat template (scoring refuses the fallback)."""
    return bool(getattr(tokenizer, "chat_template", None))
