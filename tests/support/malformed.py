"""Malformed vector sets and control-vector files, as a client could hand them to an import (issue 49): each case
writes its files and says the key its refusal must name. One table for the fast tier's rule tests, the import
route's and the CLI's."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

D, LAYERS = 576, 30  # the scripted engine's width and depth (tests.support.fakes)


def good_meta(names: list[str] | None = None, layer: int = 3) -> dict[str, Any]:
    names = names or ["rainy"]
    return {"format": "millm-vectors", "version": 1, "names": names, "layer": layer, "model": "", "d_model": D,
            "method": "diffmean", "position": "mean", "examples": {"positive": 4, "negative": 4}, "sha256": "abc",
            "source": {"concepts": ["rain"]}}


def unit_rows(n: int = 1, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, D)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def write_folder(folder: Path, meta: Any = None, vectors: np.ndarray | None = None, raw_meta: bytes | None = None,
                 raw_weights: bytes | None = None) -> Path:
    """A vector-set folder whose files hold exactly what is given (the good ones where not)."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    meta = good_meta() if meta is None else meta
    (folder / "vectors.json").write_bytes(raw_meta if raw_meta is not None else json.dumps(meta).encode())
    if raw_weights is not None:
        (folder / "vectors.safetensors").write_bytes(raw_weights)
    else:
        save_file({"vectors": unit_rows() if vectors is None else vectors}, str(folder / "vectors.safetensors"))
    return folder


def _meta(**changes: Any) -> Callable[[Path], Path]:
    return lambda folder: write_folder(folder, {**good_meta(), **changes})


def _vectors(values: np.ndarray) -> Callable[[Path], Path]:
    return lambda folder: write_folder(folder, vectors=values)


def _huge_header(folder: Path) -> Path:
    return write_folder(folder, raw_weights=struct.pack("<Q", 2**63) + b"{}" + b"\0" * 64)


def _row(value: float) -> np.ndarray:
    v = np.ones((1, D), dtype=np.float32)
    v[0, 5] = value
    return v


# case -> (writes the folder, the file its refusal names, the key it names)
FOLDERS: dict[str, tuple[Callable[[Path], Path], str, str]] = {
    "meta-list": (lambda f: write_folder(f, raw_meta=b"[]"), "vectors.json", "JSON object"),
    "meta-string": (lambda f: write_folder(f, raw_meta=b'"a string"'), "vectors.json", "JSON object"),
    "meta-not-json": (lambda f: write_folder(f, raw_meta=b"{nope"), "vectors.json", "not JSON"),
    "meta-deep": (lambda f: write_folder(f, raw_meta=b"[" * 100000), "vectors.json", "vectors.json"),
    "meta-latin1": (lambda f: write_folder(f, raw_meta=b'{"names": ["caf\xe9"]}'), "vectors.json", "UTF-8"),
    "meta-huge": (lambda f: write_folder(f, raw_meta=b" " * (2**20 + 1) + b"{}"), "vectors.json", "bytes"),
    "source-string": (_meta(source="abc"), "vectors.json", "'source'"),
    "examples-list": (_meta(examples=[1, 2]), "vectors.json", "'examples'"),
    "examples-negative": (_meta(examples={"positive": -1}), "vectors.json", "'examples'"),
    "layer-huge": (_meta(layer=10**30), "vectors.json", "'layer'"),
    "layer-true": (_meta(layer=True), "vectors.json", "'layer'"),
    "layer-negative": (_meta(layer=-1), "vectors.json", "'layer'"),
    "layer-string": (_meta(layer="3"), "vectors.json", "'layer'"),
    "layer-past-model": (_meta(layer=LAYERS), "vectors.json", "'layer'"),
    "label-escape": (lambda f: write_folder(f, good_meta(["rainy", "../../evil"]), unit_rows(2)), "vectors.json",
                     "'names'"),
    "label-empty": (lambda f: write_folder(f, good_meta(["rainy", ""]), unit_rows(2)), "vectors.json", "'names'"),
    "label-twice": (lambda f: write_folder(f, good_meta(["rainy", "Rainy"]), unit_rows(2)), "vectors.json",
                    "'names'"),
    "label-number": (lambda f: write_folder(f, good_meta(["rainy", 7]), unit_rows(2)), "vectors.json",  # type: ignore[list-item]
                     "'names'"),
    "names-missing": (_meta(names=None), "vectors.json", "'names'"),
    "format-other": (_meta(format="other"), "vectors.json", "'format'"),
    "position-other": (_meta(position="first"), "vectors.json", "'position'"),
    "model-list": (_meta(model=["x"]), "vectors.json", "'model'"),
    "d_model-wrong": (_meta(d_model=12), "vectors.json", "'d_model'"),
    "rows-mismatch": (_vectors(unit_rows(2)), "vectors.safetensors", "'vectors'"),
    "header-2^63": (_huge_header, "vectors.safetensors", "header"),
    "weights-junk": (lambda f: write_folder(f, raw_weights=b"junk"), "vectors.safetensors", "safetensors"),
    "no-vectors-tensor": (lambda f: _other_tensor(f), "vectors.safetensors", "'vectors'"),
    "int-vectors": (_vectors(np.ones((1, D), dtype=np.int32)), "vectors.safetensors", "'vectors'"),
    "nan": (_vectors(_row(np.nan)), "vectors.safetensors", "not finite"),
    "inf": (_vectors(_row(np.inf)), "vectors.safetensors", "not finite"),
    "zero": (_vectors(np.zeros((1, D), dtype=np.float32)), "vectors.safetensors", "all zeros"),
    "narrow": (lambda f: write_folder(f, {**good_meta(), "d_model": 8}, unit_rows()[:, :8]), "vectors.safetensors",
               "wide"),
}


MODEL_ONLY = frozenset({"layer-past-model", "narrow"})  # refused only against the loaded model's depth and width


def _other_tensor(folder: Path) -> Path:
    from safetensors.numpy import save_file

    write_folder(folder)
    save_file({"other": unit_rows()}, str(folder / "vectors.safetensors"))
    return folder


# control-vector GGUF files: case -> (tensors, what the refusal says)
F32 = np.ones(D, dtype=np.float32)
GGUFS: dict[str, tuple[dict[str, np.ndarray], str]] = {
    "superscript-two": ({"direction.\u00b2": F32}, "does not name a layer"),
    "arabic-three": ({"direction.\u0663": F32}, "does not name a layer"),
    "fullwidth-five": ({"direction.\uff15": F32}, "does not name a layer"),
    "plus-sign": ({"direction.+3": F32}, "does not name a layer"),
    "underscore": ({"direction.1_0": F32}, "does not name a layer"),
    "many-digits": ({"direction." + "9" * 5000: F32}, "does not name a layer"),
    "twice": ({"direction.1": F32, "direction.01": F32}, "second direction for layer 1"),
    "past-model": ({f"direction.{LAYERS}": F32}, f"past the model's last layer \\({LAYERS - 1}\\)"),
    "zero": ({"direction.2": np.zeros(D, dtype=np.float32)}, "all zeros"),
    "inf": ({"direction.2": np.full(D, np.inf, dtype=np.float32)}, "not finite"),
}


def gguf_file(path: Path, tensors: dict[str, np.ndarray], arch: str = "controlvector") -> Path:
    """A GGUF written by gguf-py directly, as repeng's export_gguf writes one."""
    import gguf as gguf_py

    writer = gguf_py.GGUFWriter(str(path), arch)
    writer.add_string(f"{arch}.model_hint", "llama")
    writer.add_uint32(f"{arch}.layer_count", len(tensors))
    for name, values in tensors.items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def empty_strings_gguf(path: Path, count: int = 2_000_000) -> Path:
    """A 16 MB GGUF whose one metadata value is an array of ``count`` empty strings (gguf-py walks it for tens
    of seconds)."""
    key = b"junk"
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 8,
                                                                                                       count)
    path.write_bytes(header + bytes(8 * count))
    return path


def huge_count_gguf(path: Path) -> Path:
    """A GGUF header that declares 2^62 metadata keys."""
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2**62) + bytes(64))
    return path
