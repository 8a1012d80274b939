"""The decode loop's forward without HF's model-level machinery, for a fused Llama model on the CPU.

The scheduler calls the model once a step with its slot cache and a mask it built (``millm.engine.decode.kv``). HF's
``LlamaForCausalLM.forward`` then runs its decorators (config defaults, output capture, a renamed keyword), checks
the mask it is handed (returned as it is), and makes an output object of several fields. This forward does for that
call what HF's does, in the same order and through the same modules: the embedding, HF's rotary embedding once for
every layer, each decoder layer, the final norm and the output projection, only of the positions whose logits are
kept (the norm and the projection act on each position alone, so their values are the same). The embedding, the
layers and the output projection are called as modules, so forward hooks on them (steering, read-outs, a user's own)
fire as under HF's forward; the final norm too while a hook watches it. Any other call (scoring, ``generate`` with
HF's cache, a call asking for more outputs) goes to HF's forward.

With int8 weights the decode loop's logits come from the int8 copy of the output projection
(``millm.engine.weights.quantize_sampling_head``) while no hook watches the model's own projection: they are only
sampled from (log-probabilities are scoring requests, on HF's forward and the fp32 projection), and per-token scales
keep a row's logits its own in a batch. In fp32 the projection is the model's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MethodType
from typing import Any

import torch

from millm.engine.decode.kv import SlotCache
from millm.engine.fused import norm


@dataclass
class StepOutput:
    """A forward's kept logits, as ``CausalLMOutputWithPast.logits``."""

    logits: torch.Tensor


def install(model: Any) -> bool:
    """The lean forward on ``model`` (in place) when every decoder layer is fused (``millm.engine.fused``);
    whether it was."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not all(hasattr(layer.self_attn, "qkv_proj") for layer in layers):
        return False
    model.forward = MethodType(causal_lm_forward, model)
    return True


def causal_lm_forward(self: Any, input_ids: torch.Tensor | None = None, attention_mask: Any = None,
                      position_ids: torch.Tensor | None = None, cache: Any = None, use_cache: bool | None = None,
                      logits_to_keep: int = 0, **kwargs: Any) -> Any:
    """``LlamaForCausalLM.forward`` for the decode loop's call (``input_ids``, its mask, positions and slot cache);
    HF's own for every other."""
    if kwargs or not isinstance(cache, SlotCache) or input_ids is None or position_ids is None:
        return type(self).forward(self, input_ids=input_ids, attention_mask=attention_mask,
                                  position_ids=position_ids, cache=cache, use_cache=use_cache,
                                  logits_to_keep=logits_to_keep, **kwargs)
    inner = self.model
    hidden = inner.embed_tokens(input_ids)
    position_embeddings = inner.rotary_emb(hidden, position_ids=position_ids)
    for layer in inner.layers:
        hidden = layer(hidden, attention_mask=attention_mask, position_embeddings=position_embeddings,
                       position_ids=position_ids, cache=cache, use_cache=use_cache)
    if logits_to_keep:
        hidden = hidden[:, -logits_to_keep:, :]
    hidden = inner.norm(hidden) if hooked(inner.norm) else norm(inner.norm, hidden)
    head = self.sampling_head if hasattr(self, "sampling_head") and not hooked(self.lm_head) else self.lm_head
    return StepOutput(head(hidden))


def hooked(module: torch.nn.Module) -> bool:
    """Whether a forward hook watches ``module``: then the step calls the module itself, so the hook sees what it
    hooked (the final norm's HF arithmetic, the fp32 output projection rather than the int8 sampling copy)."""
    return bool(module._forward_hooks or module._forward_pre_hooks)
