"""The tiny random Llama the hook tests steer: 4 layers of width ``D``, and a prompt of ``prompt_ids()``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import LlamaForCausalLM

    from millm.steering.controller import Steering

D = 32


def prompt_ids() -> torch.Tensor:
    import torch

    return torch.tensor([[5, 17, 42, 8, 99, 3]])


def tiny_llama() -> LlamaForCausalLM:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=100, hidden_size=D, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config).eval()


@contextmanager
def as_scheduled(steering: Steering, rows: int) -> Iterator[None]:
    """Forwards in this block run as the scheduler runs one: ``rows`` rows, each bound to the live values,
    under a row view (the only forwards steering steers)."""
    from millm.steering.controller import RowView

    steering.reserve_rows(rows)
    for slot in range(rows):
        steering.bind_row(slot, None)
    try:
        with steering.rows(RowView(0, rows)):
            yield
    finally:
        for slot in range(rows):
            steering.release_row(slot)
