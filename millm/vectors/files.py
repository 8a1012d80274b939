"""A vector set on disk, and how it steers: one or more named unit-norm directions at one layer's output.

A folder holds ``vectors.safetensors`` (``vectors``: ``[n, d_model]`` float32), ``vectors.json`` (what it is:
layer, model, method, how many examples, their hash) and ``labels.json`` (index -> name, what the SAE
registry reads). Read as an SAE of architecture ``linear`` (``W_dec`` the vectors, ``W_enc`` their
transpose, no biases), a vector set is registered, attached, steered and read by everything that takes an
SAE (profiles, clusters, circuits, the dial, the TUI, batch files, the management API, GGUF control
vectors): strength s adds s times the unit vector, as it adds s times a feature's decoder row, and its
"activation" is the residual's projection on it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from millm.errors import InvalidParameter
from millm.sae.model import SAE

FORMAT = "millm-vectors"
META_FILE, WEIGHTS_FILE, LABELS_FILE = "vectors.json", "vectors.safetensors", "labels.json"
METHODS = ("diffmean", "pca")
POSITIONS = ("mean", "last")


def set_name(name: str, layer: int, layers: Sequence[int]) -> str:
    """A learned or imported set's name: ``name`` when it is the only layer, else ``name-L{layer}``."""
    return name if len(layers) == 1 else f"{name}-L{layer}"


@dataclass(frozen=True)
class VectorSet:
    """Named unit-norm directions at ``layer`` of ``model``, and how they were made."""

    names: tuple[str, ...]
    vectors: torch.Tensor  # [len(names), d_model], unit rows
    layer: int
    model: str
    method: str = "diffmean"
    position: str = "mean"
    examples: dict[str, int] = field(default_factory=dict)  # positive / negative counts
    sha256: str = ""  # of the example texts, in order
    source: dict[str, Any] = field(default_factory=dict)  # the concept words, or the example files

    @property
    def d_model(self) -> int:
        return int(self.vectors.shape[1])

    def meta(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": 1, "names": list(self.names), "layer": self.layer, "model": self.model,
                "d_model": self.d_model, "method": self.method, "position": self.position,
                "examples": self.examples, "sha256": self.sha256, "source": self.source}

    def as_sae(self) -> SAE:
        """The set as an SAE whose features are its vectors (``linear``: the projection, signed)."""
        v = self.vectors.float()
        return SAE(W_enc=v.T.contiguous(), b_enc=torch.zeros(len(self.names)), W_dec=v.clone(),
                   b_dec=torch.zeros(self.d_model), architecture="linear", apply_b_dec_to_input=False)


def save(folder: Path, vs: VectorSet) -> None:
    """Write the set's folder whole or not at all: written beside it, then renamed into place."""
    from safetensors.torch import save_file

    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    save_file({"vectors": vs.vectors.float().contiguous()}, str(staging / WEIGHTS_FILE))
    (staging / META_FILE).write_text(json.dumps(vs.meta(), indent=1) + "\n")
    (staging / LABELS_FILE).write_text(json.dumps({str(i): n for i, n in enumerate(vs.names)}, indent=1) + "\n")
    os.replace(staging, folder)


def is_vector_set(folder: Path) -> bool:
    return (folder / META_FILE).is_file() and (folder / WEIGHTS_FILE).is_file()


def load(folder: Path) -> VectorSet:
    """The set in ``folder``; a malformed one is a 400 naming the file and what is wrong."""
    from safetensors.torch import load_file

    where = folder / META_FILE
    try:
        meta = json.loads(where.read_text())
        vectors = load_file(str(folder / WEIGHTS_FILE))["vectors"]
    except (OSError, ValueError, KeyError) as exc:
        raise InvalidParameter(f"{where.parent}: not a readable vector set ({exc}).", param="path") from None
    names, layer = meta.get("names"), meta.get("layer")
    if meta.get("format") != FORMAT or not isinstance(names, list) or not isinstance(layer, int) \
            or vectors.ndim != 2 or vectors.shape[0] != len(names):
        raise InvalidParameter(f"{where}: not a {FORMAT} file of {vectors.shape[0]} vectors with their names and "
                               "layer.", param="path")
    return VectorSet(tuple(str(n) for n in names), vectors.float(), layer, str(meta.get("model") or ""),
                     str(meta.get("method") or ""), str(meta.get("position") or "mean"),
                     dict(meta.get("examples") or {}), str(meta.get("sha256") or ""), dict(meta.get("source") or {}))
