"""Loading a model for the transformers engine, with the dequantised-GGUF cache."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from millm.config import Settings
from millm.errors import ModelLoadFailed
from millm.registry import ModelEntry

log = logging.getLogger(__name__)

CACHE_FORMAT = 1


def pick_device(setting: str) -> torch.device:
    """``auto`` picks CUDA where present, else the CPU."""
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(setting)


def pick_dtype(setting: str, device: torch.device) -> torch.dtype:
    """``auto`` picks bf16 on CUDA and fp32 on the CPU (where bf16 matmuls are slow)."""
    if setting == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = getattr(torch, setting, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"MILLM_DTYPE={setting!r} is not a torch dtype")
    return dtype


def dequant_cache_dir(entry: ModelEntry, settings: Settings) -> Path:
    """Where the dequantised weights of a GGUF-backed transformers model are kept."""
    return settings.cache_dir / "transformers" / f"{entry.id}-{entry.path.stat().st_size}"


def _write_dequant_cache(model: Any, tokenizer: Any, target: Path) -> None:
    """Save state dict (safetensors), config (without quantization_config) and tokenizer, atomically.

    transformers refuses ``save_pretrained`` on a GGUF-loaded model; these three pieces reload with
    ``from_pretrained`` and give identical logits. Tied embeddings keep only the input embedding.
    """
    from safetensors.torch import save_file

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tokenizer.save_pretrained(tmp)
        (tmp / "millm-cache.json").write_text(json.dumps({"format": CACHE_FORMAT}))
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _cache_is_complete(path: Path) -> bool:
    marker = path / "millm-cache.json"
    return marker.is_file() and json.loads(marker.read_text()).get("format") == CACHE_FORMAT


def load_weights(entry: ModelEntry, settings: Settings, dtype: torch.dtype) -> tuple[Any, Any]:
    """(model, tokenizer) on the CPU in ``dtype``; GGUF files go through the dequantised cache."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if entry.is_gguf:
        cache = dequant_cache_dir(entry, settings)
        if not _cache_is_complete(cache):
            log.info("dequantising %s once; later loads read %s", entry.path.name, cache)
            kw = {"gguf_file": entry.path.name}
            model = AutoModelForCausalLM.from_pretrained(entry.path.parent, dtype=torch.float32, **kw)
            tokenizer = AutoTokenizer.from_pretrained(entry.path.parent, **kw)
            _write_dequant_cache(model, tokenizer, cache)
        source = cache
    else:
        source = entry.path
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    return model, tokenizer


def load(entry: ModelEntry, settings: Settings) -> tuple[Any, Any, torch.device, torch.dtype]:
    """Load ``entry`` for the transformers engine, in eval mode on the chosen device."""
    device = pick_device(settings.device)
    dtype = pick_dtype(settings.dtype, device)
    try:
        model, tokenizer = load_weights(entry, settings, dtype)
    except Exception as exc:  # any loader failure becomes one typed error naming the model
        raise ModelLoadFailed(f"Loading '{entry.id}' from {entry.path} failed: {exc}") from exc
    model.to(device).eval()
    return model, tokenizer, device, dtype
