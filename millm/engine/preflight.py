"""What can be checked before the loaded model is unloaded: readable files, quantization, memory.

A refusal here leaves the loaded model serving; only a load that fails after the unload can leave the
server without one. Everything reads file headers and memory figures; nothing loads weights.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from millm.errors import InsufficientMemory, ModelLoadFailed, UnsupportedQuantization
from millm.registry import ModelEntry

GIB = 2**30
# checkpoint quantization methods and the package each needs; fewer than 4 bits is never taken here
CHECKPOINT_METHODS = {"bitsandbytes": "bitsandbytes", "gptq": "gptqmodel", "awq": "awq", "fp8": None}
MIN_CHECKPOINT_BITS = 4
KV_RESERVE_TOKENS = 4096  # the KV cache a load must leave room for, beside the weights
ENGINES_TAKE = ("transformers takes unquantised checkpoints (F32/F16/BF16), checkpoints quantised to 4 bits or "
                "more with an installed method, and GGUF files (dequantised once); llama.cpp takes GGUF files of "
                "any type llama.cpp reads")


@dataclass(frozen=True)
class Footprint:
    """What a model needs in memory once loaded: weights and a KV reserve, in bytes."""

    weights: int
    kv: int

    @property
    def total(self) -> int:
        return self.weights + self.kv


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def _gguf_shape(path: Path) -> tuple[int, dict[str, Any]]:
    """Parameter count and the architecture fields of a GGUF file, from its header."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except Exception as exc:  # a truncated or foreign file
        raise ModelLoadFailed(f"{path} is not a readable GGUF file: {exc}") from None
    arch = str(reader.fields["general.architecture"].contents()) if "general.architecture" in reader.fields else ""
    fields = {}
    for key in ("block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
                "context_length"):
        field = reader.fields.get(f"{arch}.{key}")
        if field is not None:
            fields[key] = int(field.contents())
    return sum(int(t.n_elements) for t in reader.tensors), fields


def _checkpoint_shape(path: Path) -> tuple[int, dict[str, Any]]:
    """Parameter count (from safetensors headers, else file sizes) and config fields of a checkpoint."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadFailed(f"{path / 'config.json'} cannot be read: {exc}") from None
    params = 0
    for file in path.glob("*.safetensors"):
        with file.open("rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for name, info in header.items():
            if name != "__metadata__":
                n = 1
                for dim in info["shape"]:
                    n *= dim
                params += n
    if params == 0:  # .bin checkpoints: assume 2 bytes a parameter on disk
        params = sum(f.stat().st_size for f in path.glob("*.bin")) // 2
    heads = config.get("num_attention_heads") or 1
    fields = {"block_count": config.get("num_hidden_layers"), "embedding_length": config.get("hidden_size"),
              "attention.head_count": heads, "attention.head_count_kv": config.get("num_key_value_heads") or heads,
              "context_length": config.get("max_position_embeddings"),
              "quantization": config.get("quantization_config")}
    return params, fields


def check_quantization(entry: ModelEntry, quantization: dict[str, Any] | None) -> None:
    """unsupported_quantization (400) for what the entry's engine cannot run."""
    if entry.engine == "llama.cpp":
        if not entry.is_gguf:
            raise UnsupportedQuantization(f"'{entry.id}' is not a GGUF file; {ENGINES_TAKE}.")
        return
    if not quantization:
        return
    method = str(quantization.get("quant_method", "unknown"))
    bits = quantization.get("bits") or quantization.get("nbits") or quantization.get("w_bit")
    if quantization.get("load_in_4bit"):
        bits = 4
    if isinstance(bits, int) and bits < MIN_CHECKPOINT_BITS:
        raise UnsupportedQuantization(f"'{entry.id}' is quantised to {bits} bits ({method}); {ENGINES_TAKE}.")
    package = CHECKPOINT_METHODS.get(method, "")
    if package == "" or (package is not None and not _installed(package)):
        raise UnsupportedQuantization(f"'{entry.id}' is quantised with {method}, which this install cannot run; "
                                      f"{ENGINES_TAKE}.")


def _installed(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is not None


def footprint(entry: ModelEntry, dtype_bytes: int) -> Footprint:
    """Weights at ``dtype_bytes`` a parameter (GGUF on llama.cpp: the file as it is) plus a KV reserve."""
    if not os.access(entry.path, os.R_OK):
        raise ModelLoadFailed(f"'{entry.id}': {entry.path} cannot be read.")
    params, fields = _gguf_shape(entry.path) if entry.is_gguf else _checkpoint_shape(entry.path)
    if entry.engine != "llama.cpp":
        check_quantization(entry, fields.get("quantization"))
    else:
        check_quantization(entry, None)
    weights = entry.path.stat().st_size if entry.engine == "llama.cpp" else params * dtype_bytes
    layers, width = fields.get("block_count") or 0, fields.get("embedding_length") or 0
    heads, kv_heads = fields.get("attention.head_count") or 1, fields.get("attention.head_count_kv") or 1
    tokens = min(fields.get("context_length") or KV_RESERVE_TOKENS, KV_RESERVE_TOKENS)
    kv = 2 * layers * tokens * (width // heads) * kv_heads * dtype_bytes
    return Footprint(weights, kv)


def free_memory(device: str) -> dict[str, int]:
    """Free bytes per device: each CUDA card for a CUDA device, else the system's available RAM."""
    import sys

    torch = sys.modules.get("torch")
    if device != "cpu" and torch is not None and torch.cuda.is_available():
        return {f"cuda:{i}": int(torch.cuda.mem_get_info(i)[0]) for i in range(torch.cuda.device_count())}
    return {"cpu": available_ram()}


def available_ram() -> int:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping), else total physical RAM."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_memory(entry: ModelEntry, need: Footprint, free: dict[str, int], freed: int = 0) -> None:
    """insufficient_memory (503) when no device, nor all of them together, holds the model.

    ``freed`` is what unloading the current model gives back (on the devices it occupies).
    """
    room = {name: size + freed for name, size in free.items()}
    if max(room.values()) >= need.total or (len(room) > 1 and sum(room.values()) >= need.total):
        return
    figures = ", ".join(f"{name}: {_gib(size)} free" for name, size in room.items())
    raise InsufficientMemory(f"'{entry.id}' needs {_gib(need.total)} ({_gib(need.weights)} of weights and a "
                             f"{_gib(need.kv)} KV reserve); {figures}.")
