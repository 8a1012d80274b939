"""Writing an SAE in SAELens v6 format: ``cfg.json`` + ``sae_weights.safetensors``.

The config is what SAELens' ``SAE.load_from_disk`` builds a ``TopKSAE`` from: top-level
``architecture``, ``d_in``, ``d_sae``, ``k``, ``dtype``, ``apply_b_dec_to_input``,
``normalize_activations``, and a ``metadata`` object (hook name, model, ``sae_lens_version`` >= 6 so no
pre-6 conversion runs). The weights file holds exactly the four tensors its state dict has (strict load).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from millm.sae.formats import load_sae
from millm.sae.model import SAE

CONFIG = "cfg.json"
WEIGHTS = "sae_weights.safetensors"
SAELENS_VERSION = "6.0.0"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def config(sae: SAE, metadata: dict[str, Any]) -> dict[str, Any]:
    """The v6 ``cfg.json`` body for a TopK ``sae``."""
    if sae.architecture != "topk" or sae.k is None:
        raise ValueError("Only TopK SAEs are written by the trainer.")
    return {"architecture": "topk", "d_in": sae.d_in, "d_sae": sae.d_sae, "k": sae.k, "dtype": "float32",
            "device": "cpu", "apply_b_dec_to_input": sae.apply_b_dec_to_input, "normalize_activations": "none",
            "reshape_activations": "none",
            "metadata": {**metadata, "sae_lens_version": SAELENS_VERSION, "sae_lens_training_version": SAELENS_VERSION}}


def save(folder: Path, sae: SAE, metadata: dict[str, Any], dtype: str = "float32") -> None:
    """Write ``sae`` (weights stored in ``dtype``: float32, or bfloat16 for half the size)."""
    from safetensors.torch import save_file

    if dtype not in DTYPES:
        raise ValueError(f"'save_dtype' must be one of {', '.join(DTYPES)}, got {dtype!r}.")
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {"W_enc": sae.W_enc, "b_enc": sae.b_enc, "W_dec": sae.W_dec, "b_dec": sae.b_dec}
    save_file({k: v.detach().to(DTYPES[dtype]).contiguous() for k, v in tensors.items()}, str(folder / WEIGHTS))
    (folder / WEIGHTS).chmod(0o644)  # safetensors writes 0600; an installed package must be readable by all
    (folder / CONFIG).write_text(json.dumps(config(sae, metadata), indent=2))


def load(folder: Path) -> SAE:
    """Read it back through miLLM's own loader (what attaching it will do)."""
    return load_sae(folder).sae
