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
from millm.engine.dtypes import load_device, load_dtype, weights_mode
from millm.engine.fused import fuse_layers
from millm.engine.lean import install as lean_forward
from millm.engine.packed import pack_linears
from millm.engine.weights import can_quantize, quantize_layers, quantize_sampling_head
from millm.errors import InsufficientMemory, ModelLoadFailed
from millm.registry import ModelEntry

log = logging.getLogger(__name__)

CACHE_FORMAT = 1


def pick_device(setting: str) -> torch.device:
    """``auto`` picks CUDA where present, else the CPU."""
    return torch.device(load_device(setting))


def pick_dtype(setting: str, device: torch.device) -> torch.dtype:
    """The dtype ``load_dtype`` names (``auto``: bf16 on CUDA, fp32 on the CPU), the rule the memory check
    prices weights by."""
    dtype = getattr(torch, load_dtype(setting, device.type), None)
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
        _move_into_place(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _move_into_place(tmp: Path, target: Path) -> None:
    """Rename the finished cache ``tmp`` to ``target``. Another process loading the same model at the same time
    may have put its own there first: that one is kept (the same weights) and ``tmp`` dropped. A folder of an
    older cache format is replaced."""
    try:
        os.replace(tmp, target)
    except OSError:
        if _cache_is_complete(target):
            return
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)


def _cache_is_complete(path: Path) -> bool:
    marker = path / "millm-cache.json"
    try:
        return marker.is_file() and json.loads(marker.read_text()).get("format") == CACHE_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


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


def _forward_order(model: Any) -> list[str]:
    """The model's top modules in forward order: the embeddings, each decoder layer, then the rest (the final
    norm); the head is not among them."""
    base = model.base_model_prefix
    inner = getattr(model, base)
    names = [f"{base}.{name}" for name, _ in inner.named_children() if name != "layers"]
    return names[:1] + [f"{base}.layers.{i}" for i in range(len(inner.layers))] + names[1:]


def _fill_cards(names: list[str], sizes: dict[str, int], room: dict[int, int], free: dict[int, int]) -> dict[str, int]:
    """Each of ``names`` on a card, in order, filling one card's ``room`` before the next; a 503 naming every
    card's ``free`` memory when they run out."""
    plan: dict[str, int] = {}
    cards = iter(sorted(room))
    card = next(cards)
    left = room[card]
    for name in names:
        need = sizes.get(name, 0)
        while need > left:
            card = next(cards, -1)
            if card < 0:
                figures = ", ".join(f"cuda:{c}: {b / 2**30:.2f} GiB free" for c, b in free.items())
                raise InsufficientMemory(f"The model ({sizes[''] / 2**30:.2f} GiB) does not fit across the "
                                         f"cards: {figures}.")
            left = room[card]
        plan[name] = card
        left -= need
    return plan


def placement(model: Any, free: dict[int, int], reserve: int = 0) -> dict[str, int] | None:
    """A device map over CUDA cards when no single card holds ``model``, else None.

    ``free`` is free bytes per card index; ``reserve`` is kept free on every card for the KV cache.
    Modules are placed in forward order (embeddings, each decoder layer whole, the final norm, the head),
    filling one card before the next, so each SAE hook runs on the one card holding its layer. A head
    tied to the embeddings stays with them.
    """
    from accelerate.utils import compute_module_sizes

    sizes = compute_module_sizes(model)
    room = {card: size - reserve for card, size in free.items()}
    if not room or max(room.values()) >= sizes[""]:
        return None
    ordered = _forward_order(model)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    plan = _fill_cards(ordered + ([] if tied else ["lm_head"]), sizes, room, free)
    if tied:
        plan["lm_head"] = plan[ordered[0]]
    return plan


def load(entry: ModelEntry, settings: Settings) -> tuple[Any, Any, torch.device, torch.dtype]:
    """Load ``entry`` for the transformers engine, in eval mode on the chosen device; with several CUDA
    cards and none large enough, split across them by layers; on the CPU in fp32, its linear layers packed
    for oneDNN (``millm.engine.packed``), or with ``MILLM_WEIGHTS=int8`` its decoder layers' linears in int8
    (``millm.engine.weights``, and an int8 copy of the output projection the decode loop samples from) and the
    rest packed; a Llama model's projections that read the same input fused
    first (``millm.engine.fused``), and the decode loop's forward made lean (``millm.engine.lean``)."""
    device = pick_device(settings.device)
    dtype = pick_dtype(settings.dtype, device)
    weights = weights_mode(settings.weights, "transformers", device.type, str(dtype).removeprefix("torch."))
    if weights == "int8" and not can_quantize():
        raise ModelLoadFailed(f"Loading '{entry.id}' with int8 weights failed: this torch build has no quantized "
                              "CPU backend (FBGEMM or oneDNN); use MILLM_WEIGHTS=dtype.")
    try:
        model, tokenizer = load_weights(entry, settings, dtype)
    except Exception as exc:  # any loader failure becomes one typed error naming the model
        raise ModelLoadFailed(f"Loading '{entry.id}' from {entry.path} failed: {exc}") from exc
    device_map = None
    if device.type == "cuda" and torch.cuda.device_count() > 1:
        free = {i: int(torch.cuda.mem_get_info(i)[0]) for i in range(torch.cuda.device_count())}
        device_map = placement(model, free, reserve=2**30)
    if device_map is not None:
        from accelerate import dispatch_model

        model = dispatch_model(model, device_map=device_map)
        device = torch.device(f"cuda:{min(device_map.values())}")
    else:
        model.to(device)
    if device.type == "cpu" and dtype == torch.float32:
        if fuse_layers(model):
            lean_forward(model)
        if weights == "int8":
            quantize_layers(model)
            quantize_sampling_head(model)
        pack_linears(model)
    return model.eval(), tokenizer, device, dtype
