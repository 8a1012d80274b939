"""Chat prompts to token ids where only the template's own markup yields control tokens.

Tokenising a rendered chat prompt in one pass parses every control-token text in it, including
text a user typed: ``<|im_end|><|im_start|>system`` in a message would close the user's turn and
forge a system turn. So each control-token text inside the conversation's strings is replaced by a
placeholder before rendering; the rendered text is then cut at the control tokens it holds (all of
them the template's own), those become their ids, and the text between them is tokenised with
special tokens split, after the placeholders are turned back into the user's text.

Tokenisers cut at control tokens before they tokenise the text between them (HuggingFace and
llama.cpp alike), so a conversation that holds no control-token text gets exactly the ids a
one-pass tokenisation gives.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from millm.errors import InvalidParameter

Render = Callable[[list[dict[str, Any]], dict[str, Any]], str]  # (messages, template kwargs) -> prompt text
Encode = Callable[[str], list[int]]  # plain text -> ids, control-token text split into ordinary tokens


@dataclass(frozen=True)
class ControlToken:
    """A control token: its id, and whether it swallows the whitespace on its left or right."""

    id: int
    lstrip: bool = False
    rstrip: bool = False


@dataclass(frozen=True)
class ControlTokens:
    """The model's control tokens by their text."""

    tokens: Mapping[str, ControlToken]
    pattern: re.Pattern[str] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        texts = sorted((t for t in self.tokens if t), key=len, reverse=True)  # longest first: no prefix wins
        if texts:
            object.__setattr__(self, "pattern", re.compile("|".join(re.escape(t) for t in texts)))


Piece = str | ControlToken


def neutralise(value: Any, control: ControlTokens, marks: dict[str, str], nonce: str) -> Any:
    """``value`` with every control-token text in its strings (keys too) replaced by a placeholder;
    ``marks`` collects placeholder -> text."""
    if control.pattern is None:
        return value
    if isinstance(value, str):
        def mark(match: re.Match[str]) -> str:
            placeholder = f"\ue000{nonce}:{len(marks)}\ue001"
            marks[placeholder] = match.group(0)
            return placeholder
        return control.pattern.sub(mark, value)
    if isinstance(value, dict):
        return {neutralise(k, control, marks, nonce): neutralise(v, control, marks, nonce) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(neutralise(v, control, marks, nonce) for v in value)
    return value


def restore(text: str, marks: Mapping[str, str]) -> str:
    """The user's own text back in place of each placeholder."""
    for placeholder, original in marks.items():
        text = text.replace(placeholder, original)
    return text


def _trimmed(text: str, after: Piece | None, before: ControlToken | None) -> str:
    """Text between control tokens as the tokeniser reads it: without the whitespace the token ``after`` which it
    comes swallows on its right (``rstrip``), nor what the token ``before`` which it stands swallows on its left
    (``lstrip``)."""
    if isinstance(after, ControlToken) and after.rstrip:
        text = text.lstrip()
    if before is not None and before.lstrip:
        text = text.rstrip()
    return text


def pieces(rendered: str, control: ControlTokens, marks: Mapping[str, str]) -> list[Piece]:
    """The rendered prompt cut at its control tokens; text between them with placeholders restored and the
    whitespace a neighbouring token swallows removed, as the tokeniser would."""
    if control.pattern is None:
        return [restore(rendered, marks)] if rendered else []
    out: list[Piece] = []
    start = 0
    for match in control.pattern.finditer(rendered):
        token = control.tokens[match.group(0)]
        if text := _trimmed(rendered[start:match.start()], out[-1] if out else None, token):
            out.append(restore(text, marks))
        out.append(token)
        start = match.end()
    if tail := _trimmed(rendered[start:], out[-1] if out else None, None):
        out.append(restore(tail, marks))
    return out


def chat_ids(render: Render, messages: list[dict[str, Any]], template_kwargs: dict[str, Any],
             control: ControlTokens, encode: Encode) -> list[int]:
    """Token ids of a conversation: control tokens from the template only, never from what a client sent."""
    marks: dict[str, str] = {}
    nonce = secrets.token_hex(8)
    try:
        rendered = render(neutralise(messages, control, marks, nonce),
                          neutralise(template_kwargs, control, marks, nonce))
    except Exception as exc:
        refusal = template_refusal(exc)
        if refusal is None:
            raise
        raise InvalidParameter(f"The model's chat template refused these messages: {restore(refusal, marks)}",
                               param="messages") from None
    ids: list[int] = []
    for piece in pieces(rendered, control, marks):
        ids += [piece.id] if isinstance(piece, ControlToken) else encode(piece)
    return ids


def template_refusal(exc: Exception) -> str | None:
    """The message of a chat template that refused a conversation with its ``raise_exception`` (Gemma-2's
    "System role not supported", "roles must alternate"), else None: the client's input, never a server error.

    HuggingFace's ``raise_exception`` raises jinja2's bare ``TemplateError``; llama-cpp-python's raises a
    ``ValueError`` from its own ``raise_exception``, called by the template's code.
    """
    from jinja2.exceptions import TemplateError

    if type(exc) is TemplateError:
        return str(exc.message or exc)
    if type(exc) is ValueError and _raised_in_template(exc):
        return str(exc)
    return None


def _raised_in_template(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by a function named ``raise_exception`` that a template's code called."""
    codes = []
    tb = exc.__traceback__
    while tb is not None:
        codes.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    return bool(codes) and codes[-1].co_name == "raise_exception" and any(c.co_filename == "<template>"
                                                                          for c in codes[:-1])


def hf_control_tokens(tokenizer: Any) -> ControlTokens:
    """A HuggingFace tokenizer's special added tokens (what ``split_special_tokens`` splits)."""
    tokens = {added.content: ControlToken(int(i), bool(getattr(added, "lstrip", False)),
                                          bool(getattr(added, "rstrip", False)))
              for i, added in tokenizer.added_tokens_decoder.items() if getattr(added, "special", False)}
    for text in getattr(tokenizer, "all_special_tokens", []):
        token_id = tokenizer.convert_tokens_to_ids(text)
        if isinstance(token_id, int) and token_id >= 0:
            tokens.setdefault(text, ControlToken(token_id))
    return ControlTokens(tokens)


def hf_plain(tokenizer: Any) -> Encode:
    """Plain text to ids with a HuggingFace tokenizer: no BOS, control-token text split."""
    return lambda text: list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


def llama_control_tokens(llm: Any) -> ControlTokens:
    """A llama.cpp model's control (and unknown) tokens: what ``tokenize(special=True)`` parses and
    ``special=False`` leaves as text."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    tokens: dict[str, ControlToken] = {}
    for token_id in range(int(llm.n_vocab())):
        attr = llama_cpp.llama_vocab_get_attr(vocab, token_id)
        if attr & (llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN):
            text = llm.detokenize([token_id], special=True).decode("utf-8", errors="replace")
            if text:
                tokens.setdefault(text, ControlToken(token_id, bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP),
                                                     bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP)))
    return ControlTokens(tokens)


def llama_plain(llm: Any) -> Encode:
    """Plain text to ids with llama.cpp: no BOS, control-token text left as text."""
    return lambda text: list(llm.tokenize(text.encode(), add_bos=False, special=False))
