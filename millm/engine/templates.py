"""Rendering chat messages into the text the model reads."""

from __future__ import annotations

from typing import Any

# chat templates' end-of-turn markers: generation stops on them like on EOS (both engines)
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>")

FALLBACK_NAMES = {"system": "System", "user": "User", "assistant": "Assistant",
                  "tool": "Tool", "function": "Function", "developer": "Developer"}


def fallback_template(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    """A plain 'Role: text' transcript for models that ship no chat template."""
    text = "".join(f"{FALLBACK_NAMES[m['role']]}: {m['content']}\n\n" for m in messages)
    return text + ("Assistant:" if add_generation_prompt else "")


def _apply(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool,
           template_kwargs: dict[str, Any]) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False,
                                             **template_kwargs)
    return fallback_template(messages, add_generation_prompt)


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], template_kwargs: dict[str, Any] | None = None) -> str:
    """The prompt text for ``messages`` (already validated, content as plain strings).

    A trailing assistant message is a partial answer to continue, not a turn to close: everything
    before it is rendered with the generation prompt and the partial is appended raw, so the model
    resumes mid-sentence instead of starting a new answer. ``template_kwargs`` are extra variables
    for the model's own template (``enable_thinking``, say).
    """
    kwargs = template_kwargs or {}
    if messages[-1]["role"] == "assistant":
        return _apply(tokenizer, messages[:-1], True, kwargs) + messages[-1]["content"]
    return _apply(tokenizer, messages, True, kwargs)


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the model ships its own chat template (scoring refuses the fallback)."""
    return bool(getattr(tokenizer, "chat_template", None))
