"""Which device and dtype a transformers load uses: one rule, read by the loader and the memory check.

The pre-load memory check prices weights at the bytes a parameter takes in the dtype the loader will
really use, so both ask here. ``auto`` means CUDA where present, else the CPU; and bf16 on CUDA, fp32
on the CPU (where bf16 matmuls are slow). Nothing here imports torch unless ``auto`` has to ask it.
"""

from __future__ import annotations

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
