"""SAEs built by tests: random weights written in each published format."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

    from millm.sae.model import SAE


def random_sae(d_in: int, d_sae: int, seed: int = 0, architecture: str = "relu", **kw) -> SAE:
    import torch

    from millm.sae.model import SAE

    g = torch.Generator().manual_seed(seed)
    W_dec = torch.randn(d_sae, d_in, generator=g)
    W_dec = W_dec / W_dec.norm(dim=-1, keepdim=True)
    threshold = torch.rand(d_sae, generator=g) * 0.1 if architecture == "jumprelu" else None
    return SAE(W_enc=W_dec.T.clone() * 0.5, b_enc=torch.randn(d_sae, generator=g) * 0.01, W_dec=W_dec,
               b_dec=torch.randn(d_in, generator=g) * 0.01, architecture=architecture, threshold=threshold, **kw)


@contextmanager
def attached_random(engine: Any, sae_id: str, seed: int, layer: int = 10, d_sae: int = 32) -> Iterator[str]:
    """A random SAE attached to ``engine`` at ``layer`` as ``sae_id`` while the block runs."""
    engine.steering.attach(sae_id, random_sae(engine.steering.d_model, d_sae, seed=seed), layer)
    try:
        yield sae_id
    finally:
        engine.steering.detach(sae_id)


def write_saelens_files(folder: Path, tensors: dict[str, torch.Tensor], cfg: dict) -> Path:
    """SAELens' on-disk layout (``save_model``): cfg.json beside sae_weights.safetensors."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "sae_weights.safetensors"))
    (folder / "cfg.json").write_text(json.dumps(cfg))
    return folder


def write_saelens(folder: Path, sae: SAE, layer: int, v6: bool = False, **cfg_extra) -> Path:
    tensors = {"W_enc": sae.W_enc, "b_enc": sae.b_enc, "W_dec": sae.W_dec, "b_dec": sae.b_dec}
    if sae.threshold is not None:
        tensors["threshold"] = sae.threshold
    arch = {"relu": "standard"}.get(sae.architecture, sae.architecture)
    if v6:
        cfg = {"architecture": arch, "d_in": sae.d_in, "d_sae": sae.d_sae,
               "apply_b_dec_to_input": sae.apply_b_dec_to_input, "normalize_activations": "none",
               "metadata": {"hook_name": f"blocks.{layer}.hook_resid_post", "model_name": "SmolLM2-135M-Instruct",
                            "sae_lens_version": "6.54.0"}}
        if sae.k:
            cfg["k"] = sae.k
    else:
        cfg = {"d_in": sae.d_in, "d_sae": sae.d_sae, "hook_name": f"blocks.{layer}.hook_resid_post",
               "hook_layer": layer, "architecture": arch, "activation_fn_str": "relu",
               "apply_b_dec_to_input": sae.apply_b_dec_to_input, "normalize_activations": "none",
               "model_name": "SmolLM2-135M-Instruct"}
        if sae.k:
            cfg["activation_fn_kwargs"] = {"k": sae.k}
    cfg.update(cfg_extra)
    return write_saelens_files(folder, tensors, cfg)


def write_gemma_scope(folder: Path, sae: SAE) -> Path:
    assert sae.threshold is not None
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "params.npz", W_enc=sae.W_enc.numpy(), W_dec=sae.W_dec.numpy(), b_enc=sae.b_enc.numpy(),
             b_dec=sae.b_dec.numpy(), threshold=sae.threshold.numpy())
    return folder / "params.npz"


def write_llama_scope(folder: Path, sae: SAE, threshold: float, norm_in: float | None = None,
                      weights: dict[str, torch.Tensor] | None = None, **cfg_extra) -> Path:
    """Llama Scope's layout: hyperparams.json with the published keys, checkpoints/final.safetensors with lm-saes'
    nn.Linear names (``encoder.weight`` [d_sae, d_in], ``decoder.weight`` [d_in, d_sae])."""
    from safetensors.torch import save_file

    (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
    tensors = {"encoder.weight": sae.W_enc.T.contiguous(), "encoder.bias": sae.b_enc,
               "decoder.weight": sae.W_dec.T.contiguous(), "decoder.bias": sae.b_dec, **(weights or {})}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "checkpoints" / "final.safetensors"))
    cfg = {"d_model": sae.d_in, "expansion_factor": sae.d_sae // sae.d_in, "hook_point_in": "blocks.3.hook_resid_post",
           "hook_point_out": "blocks.3.hook_resid_post", "use_decoder_bias": True,
           "apply_decoder_bias_to_pre_encoder": sae.apply_b_dec_to_input, "act_fn": "jumprelu",
           "jump_relu_threshold": threshold, "sparsity_include_decoder_norm": True, "top_k": 50,
           "norm_activation": "inference" if norm_in is None else "dataset-wise"}
    if norm_in is not None:
        cfg["dataset_average_activation_norm"] = {"in": norm_in, "out": norm_in}
    cfg.update(cfg_extra)
    (folder / "hyperparams.json").write_text(json.dumps(cfg))
    return folder


def write_sparsify(folder: Path, sae: SAE, **cfg_extra) -> Path:
    """sparsify's ``SparseCoder.save_to_disk``: sae.safetensors (``encoder.weight`` [d_sae, d_in], ``W_dec``
    [d_sae, d_in]) and cfg.json (its config plus ``d_in``)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({"encoder.weight": sae.W_enc.T.contiguous(), "encoder.bias": sae.b_enc, "W_dec": sae.W_dec.contiguous(),
               "b_dec": sae.b_dec}, str(folder / "sae.safetensors"))
    cfg = {"activation": "topk", "expansion_factor": sae.d_sae // sae.d_in, "normalize_decoder": True,
           "num_latents": sae.d_sae, "k": sae.k, "multi_topk": False, "skip_connection": False, "transcode": False,
           "d_in": sae.d_in, **cfg_extra}
    (folder / "cfg.json").write_text(json.dumps(cfg))
    return folder
