"""Incremental detokenising: turn a growing list of token ids into text pieces, never splitting UTF-8."""

from __future__ import annotations

from typing import Protocol

REPLACEMENT = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    """Emits only text that later tokens can no longer change.

    A token that ends mid-way through a multi-byte character decodes to U+FFFD; its text is held
    until the character completes. New text is measured against a window that starts one emitted
    token back, so tokenizers that render a leading space from context (SentencePiece) keep it.
    """

    def __init__(self, tokenizer: Decoder) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0  # window start: one emitted token before the read point
        self._read = 0  # ids before this index have had their text emitted

    def _pending_text(self) -> str:
        decode = self.tokenizer.decode
        done = decode(self.ids[self._prefix:self._read], skip_special_tokens=True)
        return decode(self.ids[self._prefix:], skip_special_tokens=True)[len(done):]

    def push(self, token_id: int) -> str:
        """Add one token; return the newly final text (possibly empty)."""
        self.ids.append(token_id)
        piece = self._pending_text()
        if piece.endswith(REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return piece

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end)."""
        piece = self._pending_text()
        self._prefix, self._read = self._read, len(self.ids)
        return piece


class _KeepSpecial:
    """A tokenizer whose decode keeps special tokens: a read-out's texts cover every position it reports
    (a chat template's ``<|im_start|>`` included), so they join to the text the model read."""

    def __init__(self, tokenizer: Decoder) -> None:
        self.tokenizer = tokenizer

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))


def token_texts(tokenizer: Decoder, ids: list[int]) -> list[str]:
    """Each token's text in context, joining to the decoded ``ids``: decoded incrementally as generation is, so
    a SentencePiece token keeps the leading space its neighbour gives it, and a token that ends mid-way
    through a character has "" while the token completing it carries the character."""
    detok = IncrementalDetokenizer(_KeepSpecial(tokenizer))
    texts = [detok.push(token) for token in ids]
    if texts:
        texts[-1] += detok.flush()
    return texts
