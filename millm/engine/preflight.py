"""What can be checked before the loaded model is unloaded: readable files, quantization, memory.

A refusal here leaves the loaded model serving; only a load that fails after the unload can leave the
server without one. Everything reads file headers and memory figures; nothing loads weights.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from millm.errors import InsufficientMemory, InvalidModelFiles, ModelLoadFailed, UnsupportedQuantization
from millm.registry import ModelEntry

GIB = 2**30
# checkpoint quantization methods and the package each needs; fewer than 4 bits is never taken here
CHECKPOINT_METHODS = {"bitsandbytes": "bitsandbytes", "gptq": "gptqmodel", "awq": "awq", "fp8": None}
MIN_CHECKPOINT_BITS = 4
KV_RESERVE_TOKENS = 4096  # the KV cache a load must leave room for, beside the weights
SAFETENSORS_HEADER_MAX = 100 * 2**20  # the safetensors format's own limit on its JSON header
LLAMA_KV_BYTES = 2  # llama.cpp keeps its KV cache in f16
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


def regular(entry: ModelEntry, file: Path) -> Path:
    """``file`` when it is a regular file; else 422 naming it. Nothing here opens anything else: a FIFO blocks
    its reader until a writer comes, and a directory named like a weights file is no weights file."""
    try:
        mode = file.stat().st_mode
    except OSError as exc:
        raise ModelLoadFailed(f"'{entry.id}': {file} cannot be read: {exc.strerror}.") from None
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
        raise InvalidModelFiles(f"'{entry.id}': {file} is {kind}, not a model file.")
    return file


def _gguf_shape(entry: ModelEntry) -> tuple[int, dict[str, Any]]:
    """Parameter count and the architecture fields of a GGUF file, from its header (422 when malformed)."""
    import gguf

    path = regular(entry, entry.path)
    try:
        reader = gguf.GGUFReader(path)
        arch = str(reader.fields["general.architecture"].contents()) if "general.architecture" in reader.fields else ""
        fields = {}
        for key in ("block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
                    "context_length"):
            field = reader.fields.get(f"{arch}.{key}")
            if field is not None:
                fields[key] = int(field.contents())
        return sum(int(t.n_elements) for t in reader.tensors), fields
    except Exception as exc:  # a truncated or foreign file
        raise InvalidModelFiles(f"'{entry.id}': {path} is not a readable GGUF file: {exc}") from None


def _read_config(entry: ModelEntry) -> dict[str, Any]:
    """A checkpoint's config.json as an object (422 when it is not one)."""
    file = regular(entry, entry.path / "config.json")
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelLoadFailed(f"'{entry.id}': {file} cannot be read: {exc.strerror}.") from None
    except UnicodeDecodeError:
        raise InvalidModelFiles(f"'{entry.id}': {file} is not UTF-8 text.") from None
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise InvalidModelFiles(f"'{entry.id}': {file} is not valid JSON ({exc}).") from None
    if not isinstance(config, dict):
        raise InvalidModelFiles(f"'{entry.id}': {file} must hold a JSON object, not {type(config).__name__}.")
    return config


def _count(entry: ModelEntry, config: dict[str, Any], key: str) -> int | None:
    """A positive integer field of config.json, or None when absent (422 when it is something else)."""
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidModelFiles(f"'{entry.id}': config.json '{key}' must be a positive integer, got {value!r}.")
    return value


def _malformed(entry: ModelEntry, file: Path, problem: str) -> InvalidModelFiles:
    """The 422 for a safetensors file whose header is not the format's."""
    return InvalidModelFiles(f"'{entry.id}': {file.name} has a malformed safetensors header: {problem}.")


def _safetensors_header(entry: ModelEntry, file: Path) -> dict[str, Any]:
    """A safetensors file's JSON header, its declared length checked to fit the file before it is read."""
    regular(entry, file)
    try:
        with file.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size <= min(SAFETENSORS_HEADER_MAX, file.stat().st_size - 8):
                raise _malformed(entry, file, f"it declares {size} header bytes in a {file.stat().st_size}-byte file")
            raw = f.read(size)
    except OSError as exc:
        raise ModelLoadFailed(f"'{entry.id}': {file} cannot be read: {exc.strerror}.") from None
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise _malformed(entry, file, f"not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise _malformed(entry, file, "not a JSON object")
    return header


def _is_shape(shape: object) -> TypeGuard[list[int]]:
    """Whether a header's ``shape`` is a list of non-negative integers (not booleans)."""
    return isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)


def _safetensors_params(entry: ModelEntry, file: Path) -> int:
    """Parameters described by one safetensors file's header (422 for a header that is not the format's)."""
    params = 0
    for name, info in _safetensors_header(entry, file).items():
        if name == "__metadata__":
            continue
        shape = info.get("shape") if isinstance(info, dict) else None
        if not _is_shape(shape):
            raise _malformed(entry, file, f"tensor {name!r} has no shape of non-negative integers")
        params += math.prod(shape)
    return params


def _checkpoint_shape(entry: ModelEntry) -> tuple[int, dict[str, Any]]:
    """Parameter count (from safetensors headers, else file sizes) and config fields of a checkpoint."""
    path = entry.path
    config = _read_config(entry)
    params = sum(_safetensors_params(entry, file) for file in sorted(path.glob("*.safetensors")))
    if params == 0:  # .bin checkpoints: assume 2 bytes a parameter on disk
        params = sum(regular(entry, f).stat().st_size for f in path.glob("*.bin")) // 2
    quantization = config.get("quantization_config")
    if quantization is not None and not isinstance(quantization, dict):
        raise InvalidModelFiles(f"'{entry.id}': config.json 'quantization_config' must be an object.")
    heads = _count(entry, config, "num_attention_heads") or 1
    fields = {"block_count": _count(entry, config, "num_hidden_layers"),
              "embedding_length": _count(entry, config, "hidden_size"),
              "attention.head_count": heads,
              "attention.head_count_kv": _count(entry, config, "num_key_value_heads") or heads,
              "context_length": _count(entry, config, "max_position_embeddings"),
              "quantization": quantization}
    return params, fields


def _quantized_bits(quantization: dict[str, Any]) -> Any:
    """The bits a ``quantization_config`` gives each weight (4 for bitsandbytes' ``load_in_4bit``), None when it
    does not say."""
    if quantization.get("load_in_4bit"):
        return 4
    return quantization.get("bits") or quantization.get("nbits") or quantization.get("w_bit")


def _can_run(method: str) -> bool:
    """Whether this install runs checkpoints quantised with ``method``: a method transformers knows, whose package
    (when it needs one) is installed."""
    package = CHECKPOINT_METHODS.get(method, "")
    return package != "" and (package is None or _installed(package))


def check_quantization(entry: ModelEntry, quantization: dict[str, Any] | None) -> None:
    """unsupported_quantization (400) for what the entry's engine cannot run."""
    if entry.engine == "llama.cpp":
        if not entry.is_gguf:
            raise UnsupportedQuantization(f"'{entry.id}' is not a GGUF file; {ENGINES_TAKE}.")
        return
    if not quantization:
        return
    method = str(quantization.get("quant_method", "unknown"))
    bits = _quantized_bits(quantization)
    if isinstance(bits, int) and bits < MIN_CHECKPOINT_BITS:
        raise UnsupportedQuantization(f"'{entry.id}' is quantised to {bits} bits ({method}); {ENGINES_TAKE}.")
    if not _can_run(method):
        raise UnsupportedQuantization(f"'{entry.id}' is quantised with {method}, which this install cannot run; "
                                      f"{ENGINES_TAKE}.")


def _installed(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is not None


def _kv_bytes(fields: dict[str, Any], per_value: int) -> int:
    """The KV reserve: keys and values of every layer for ``KV_RESERVE_TOKENS`` (or the context, when shorter),
    ``per_value`` bytes each; fields a model does not give count as one head, or nothing."""
    layers, width = fields.get("block_count") or 0, fields.get("embedding_length") or 0
    heads, kv_heads = fields.get("attention.head_count") or 1, fields.get("attention.head_count_kv") or 1
    tokens = min(fields.get("context_length") or KV_RESERVE_TOKENS, KV_RESERVE_TOKENS)
    return 2 * layers * tokens * (width // heads) * kv_heads * per_value


def footprint(entry: ModelEntry, dtype_bytes: int) -> Footprint:
    """Weights at ``dtype_bytes`` a parameter (GGUF on llama.cpp: the file as it is) plus a KV reserve.

    Reads each file's header once; a malformed one is a 422 naming the file, before anything is unloaded.
    """
    if not os.access(entry.path, os.R_OK):
        raise ModelLoadFailed(f"'{entry.id}': {entry.path} cannot be read.")
    params, fields = _gguf_shape(entry) if entry.is_gguf else _checkpoint_shape(entry)
    check_quantization(entry, None if entry.engine == "llama.cpp" else fields.get("quantization"))
    llama = entry.engine == "llama.cpp"
    weights = entry.path.stat().st_size if llama else params * dtype_bytes
    return Footprint(weights, _kv_bytes(fields, LLAMA_KV_BYTES if llama else dtype_bytes))


def weights_on_disk(entry: ModelEntry, dtype_bytes: int) -> int:
    """The weights of a loaded model, for what unloading it frees; a GGUF file on llama.cpp is its size
    (no header parse: a swap reads only the target's header)."""
    if entry.engine == "llama.cpp" and entry.path.is_file():
        return entry.path.stat().st_size
    return footprint(entry, dtype_bytes).weights


def resident_bytes(model: Any) -> dict[str, int]:
    """Bytes a torch module's parameters and buffers occupy on each device (``cuda:0``, ``cpu``)."""
    held: dict[str, int] = {}
    tensors = [*model.parameters(), *model.buffers()]
    for tensor in tensors:
        device = str(tensor.device)
        held[device] = held.get(device, 0) + tensor.numel() * tensor.element_size()
    return held


def used_between(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """Per device, the free memory a load took (free before minus free after, never negative)."""
    return {name: max(0, size - after.get(name, size)) for name, size in before.items()}


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


def check_memory(entry: ModelEntry, need: Footprint, free: Mapping[str, int],
                 freed: Mapping[str, int] | None = None, unplaced: int = 0) -> None:
    """insufficient_memory (503) when no device, nor all of them together, holds the model.

    ``freed`` is what unloading the current model gives back on each device it occupies, counted on that
    device only: a card the current model does not use gains nothing from its unload. ``unplaced`` is
    freed memory whose devices are not known; it counts toward the split across all devices only.
    """
    freed = freed or {}
    room = {name: size + freed.get(name, 0) for name, size in free.items()}
    if max(room.values()) >= need.total or (len(room) > 1 and sum(room.values()) + unplaced >= need.total):
        return
    figures = ", ".join(f"{name}: {_gib(size)} free" for name, size in room.items())
    raise InsufficientMemory(f"'{entry.id}' needs {_gib(need.total)} ({_gib(need.weights)} of weights and a "
                             f"{_gib(need.kv)} KV reserve); {figures}.")
