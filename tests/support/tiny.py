"""A small random transformers model on the bundled tokenizer, for engine paths on other attention layouts."""

from __future__ import annotations

from typing import Any


def tiny_engine(engine: Any, **config: Any) -> Any:
    """A small random Qwen2 on the bundled tokenizer: the decode loop on another attention layout."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from millm.engine.transformers_engine import TransformersEngine

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=int(engine.model.config.vocab_size), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, **config)
    model = Qwen2ForCausalLM(cfg).eval()
    return TransformersEngine(engine.entry, model, engine.tokenizer, torch.device("cpu"), torch.float32)
