"""Which device and dtype a transformers load uses: one rule, read by the loader and the memory check.

The pre-load memory check prices weights at the bytes a parameter takes in the dtype the loader will
really use, so both ask here. ``auto`` means CUDA where present, else the CPU; and bf16 on CUDA, fp32
on the CPU (where bf16 matmuls are slow). Nothing here imports torch unless ``auto`` has to ask it.

``MILLM_WEIGHTS`` (``--weights``) says how the linear layers' weights are kept: ``dtype`` (in the dtype above),
``int8`` (the decoder layers' linears in 8 bits, ``millm.engine.weights``: the transformers engine on the CPU in
float32 only, refused elsewhere naming ``weights``) or ``auto`` (``CPU_WEIGHTS`` where int8 can apply, else
``dtype``; never refused).
"""

from __future__ import annotations

from millm.errors import InvalidParameter

CPU_WEIGHTS = "dtype"  # what MILLM_WEIGHTS=auto means for the transformers engine on the CPU in float32
# (docs/benchmarks.md#int8-weights: int8 moves quality beyond noise, so it stays an option)

BYTES = {"float32": 4, "float": 4, "float64": 8, "double": 8, "bfloat16": 2, "float16": 2, "half": 2}


def load_device(setting: str) -> str:
    """The device type a load with MILLM_DEVICE=``setting`` uses: ``cuda`` or ``cpu`` for ``auto``,
    else the setting as given (``cuda:1``, ``cpu``, ``mps``)."""
    if setting != "auto":
        return setting
    import torch  # already loaded wherever a transformers model is about to be

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_dtype(setting: str, device: str) -> str:
    """The torch dtype name a load with MILLM_DTYPE=``setting`` on ``device`` uses."""
    if setting == "auto":
        return "bfloat16" if device.split(":")[0] == "cuda" else "float32"
    return setting


def dtype_bytes(name: str) -> int:
    """Bytes a parameter takes in the dtype ``name`` (4 for one this table does not know)."""
    return BYTES.get(name, 4)


def weights_mode(setting: str, engine: str, device: str, dtype: str) -> str:
    """How a load with MILLM_WEIGHTS=``setting`` keeps its linear layers' weights: ``int8`` or ``dtype``.
    ``engine`` is the engine that runs the model, ``device`` and ``dtype`` what ``load_device`` and
    ``load_dtype`` name. An explicit ``int8`` that cannot apply is refused (400 naming ``weights``), as a
    quantization a model or device cannot take is refused at start-up by vLLM; ``auto`` falls back to ``dtype``."""
    fits = engine == "transformers" and device.split(":")[0] == "cpu" and dtype in ("float32", "float")
    if setting == "int8" and not fits:
        where = (f"the {engine} engine (a GGUF file's weights are the file's quantization)" if engine != "transformers"
                 else f"device {device!r} (int8 weights run on the CPU only)" if device.split(":")[0] != "cpu"
                 else f"dtype {dtype!r} (int8 weights multiply float32 activations: MILLM_DTYPE=float32 or auto)")
        raise InvalidParameter(f"MILLM_WEIGHTS=int8 (--weights int8) cannot apply to {where}; use --weights dtype "
                               "or auto.", param="weights")
    if setting == "auto":
        return CPU_WEIGHTS if fits else "dtype"
    return setting
