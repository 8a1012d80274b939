"""Fixed-size KV slots for continuous batching: one preallocated tensor per layer, indexed by slot.

Each row of a batch owns one slot for its whole life; its keys and values are written at its own
positions in place and never moved, so rows join and leave without re-concatenating anything. A
forward reads a *view* of slots ``[first, first + rows)`` up to a span rounded up to ``SPAN_STEP``,
which keeps the shapes of a decode step to a few buckets (what a captured CUDA graph needs later).

The object is also the cache handed to the HuggingFace model: ``update`` is the one method a
Llama-style attention layer calls on its cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

SPAN_STEP = 32


def span_for(longest: int, slot_len: int) -> int:
    """Positions a forward attends over: ``longest`` rounded up to ``SPAN_STEP``, at most the slot."""
    return min(slot_len, -(-longest // SPAN_STEP) * SPAN_STEP)


def attention_mask(positions: torch.Tensor, span: int, window: int | None = None) -> torch.Tensor:
    """A boolean ``[rows, 1, q, span]`` mask: each query sees its own row's keys up to its own position
    (with ``window``, only the last ``window`` of them: HF's sliding-window rule, key > query - window)."""
    keys = torch.arange(span, device=positions.device).view(1, 1, 1, span)
    queries = positions.unsqueeze(1).unsqueeze(-1)
    seen = keys <= queries
    return seen if window is None else seen & (keys > queries - window)


ATTENTION_LAYERS = {"full_attention", "sliding_attention"}


@dataclass(frozen=True)
class KVShape:
    """What a model's KV cache is made of, and how its layers attend: ``window`` for sliding-window layers
    (every layer, or those ``config.layer_types`` names, ``by_type``)."""

    layers: int
    kv_heads: int
    head_dim: int
    window: int | None = None
    by_type: bool = False

    @classmethod
    def of(cls, config: Any) -> KVShape:
        """The shape of ``config``'s cache; a model with other than attention layers is refused."""
        from millm.errors import UnsupportedArchitecture

        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        types = list(getattr(config, "layer_types", None) or [])
        if unknown := sorted(set(types) - ATTENTION_LAYERS):
            raise UnsupportedArchitecture(f"This model has {', '.join(unknown)} layers; miLLM generates only with "
                                          "attention layers (full or sliding-window), whose state is a KV cache.")
        window = getattr(config, "sliding_window", None)
        sliding = "sliding_attention" in types if types else getattr(config, "use_sliding_window", True) is not False
        return cls(int(config.num_hidden_layers), int(getattr(config, "num_key_value_heads", None) or heads), head_dim,
                   int(window) if sliding and window else None, bool(types))

    def masks(self, reads: torch.Tensor, span: int) -> torch.Tensor | dict[str, torch.Tensor]:
        """The attention mask(s) a forward passes: one for every layer, or one per layer type."""
        full = attention_mask(reads, span)
        if self.window is None:
            return full
        sliding = attention_mask(reads, span, self.window)
        return {"full_attention": full, "sliding_attention": sliding} if self.by_type else sliding


class SlotCache:
    """``slots`` KV slots of ``slot_len`` positions each, for every layer.

    Stored ``[slots, slot_len, kv_heads, head_dim]`` so that one position of one slot is one contiguous
    block: a forward's writes are a single ``index_copy_`` over (slot, position) pairs.

    Storage is allocated empty and zeroed lazily as forwards reach further (``_clean``), so memory is
    touched only up to the longest span used; positions a row has not written hold finite zeros or an
    earlier row's values, which its mask hides.
    """

    def __init__(self, shape: KVShape, slots: int, slot_len: int, dtype: torch.dtype, device: torch.device) -> None:
        self.shape, self.slots, self.slot_len = shape, slots, slot_len
        size = (slots, slot_len, shape.kv_heads, shape.head_dim)
        self.keys = [torch.empty(size, dtype=dtype, device=device) for _ in range(shape.layers)]
        self.values = [torch.empty(size, dtype=dtype, device=device) for _ in range(shape.layers)]
        self._clean = 0
        self._rows = slice(0, 0)
        self._flat = torch.zeros(0, dtype=torch.long)
        self._span = 0
        heads, dim = shape.kv_heads, shape.head_dim
        self._writable = [(k.view(-1, heads, dim), v.view(-1, heads, dim)) for k, v in zip(self.keys, self.values)]
        self._bound: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._bound_at: tuple[int, int, int] | None = None

    @property
    def nbytes(self) -> int:
        """The memory its keys and values take, allocated whole."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    @property
    def aside(self) -> int:
        """The position no fed token ever takes (a row's prompt and fed tokens end before a slot's last
        position): filler and padding queries write their keys there, and nothing reads them."""
        return self.slot_len - 1

    def bind(self, first: int, positions: torch.Tensor,
             reads: torch.Tensor | None = None) -> torch.Tensor | dict[str, torch.Tensor]:
        """Prepare one forward over slots ``[first, first + len(positions))`` writing at ``positions``
        (``[rows, q]``); returns the attention mask for it, each query seeing keys up to its position in
        ``reads`` (default: where it writes; a filler row of a decode step writes aside and reads key 0)."""
        reads = positions if reads is None else reads
        rows = positions.shape[0]
        span = span_for(int(reads.max()) + 1, self.slot_len)
        if span > self._clean:
            for tensor in (*self.keys, *self.values):
                tensor[:, self._clean:span].zero_()
            self._clean = span
        self._rows = slice(first, first + rows)
        slots = torch.arange(first, first + rows, device=positions.device).unsqueeze(1)
        self._flat = (slots * self.slot_len + positions).reshape(-1)
        self._span = span
        if self._bound_at != (first, rows, span):  # the views a forward reads: made again only when they move
            self._bound = [(k[self._rows, :span].transpose(1, 2), v[self._rows, :span].transpose(1, 2))
                           for k, v in zip(self.keys, self.values)]
            self._bound_at = (first, rows, span)
        return self.shape.masks(reads, span)

    def copy_prefix(self, source: int, target: int, length: int) -> None:
        """Slot ``target`` gets slot ``source``'s first ``length`` keys and values (n > 1: one prompt
        prefilled once, its KV copied to every other choice)."""
        for tensor in (*self.keys, *self.values):
            tensor[target, :length] = tensor[source, :length]

    def write(self, layer_idx: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this forward's keys and values (``[rows, q, kv_heads, head_dim]``, the projections' own layout)
        at each row's own positions; return the bound view, ``[rows, kv_heads, span, head_dim]``."""
        stored_keys, stored_values = self._writable[layer_idx]
        heads, dim = self.shape.kv_heads, self.shape.head_dim
        stored_keys.index_copy_(0, self._flat, keys.reshape(-1, heads, dim))
        stored_values.index_copy_(0, self._flat, values.reshape(-1, heads, dim))
        return self._bound[layer_idx]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """HF's cache call (``[rows, kv_heads, q, head_dim]``): ``write`` of the same keys and values."""
        return self.write(layer_idx, key_states.transpose(1, 2), value_states.transpose(1, 2))

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._span
