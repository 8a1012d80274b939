"""The tiny random Llama the hook tests steer: 4 layers of width ``D``, and a prompt of ``IDS``."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

D = 32
IDS = torch.tensor([[5, 17, 42, 8, 99, 3]])


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=100, hidden_size=D, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config).eval()
