"""llama.cpp control-vector files: steering directions in the GGUF that ``llama-cli --control-vector``,
``cvector-generator`` and repeng's ``export_gguf`` write and read.

The format (llama.cpp ``common.cpp``, ``llama_control_vector_load_one``): ``general.architecture`` is
``controlvector``, ``controlvector.model_hint`` names the model (llama.cpp does not read it) and
``controlvector.layer_count`` counts the directions; each tensor ``direction.N`` (float32, ``[n_embd]``) is
added to the output of llama.cpp's layer ``N``, which is miLLM's layer ``N`` (``millm.steering.cvec``). Layer
0's output has no control vector, so ``direction.0`` is refused there and here. llama.cpp multiplies the file
by the scale it is given (``--control-vector-scaled FILE S``), so a vector set is written at unit norm (S is
its strength) and a profile with its strengths baked in (scale 1).
"""

from __future__ import annotations

import math
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from millm.errors import InvalidParameter, MillmError
from millm.steering.profiles import ProfileDoc
from millm.steering.service import SteeringService
from millm.steering.values import clamp
from millm.vectors.files import VectorSet, set_name

if TYPE_CHECKING:
    from gguf import GGUFReader, ReaderTensor

ARCH = "controlvector"
HINT_KEY, COUNT_KEY = f"{ARCH}.model_hint", f"{ARCH}.layer_count"
DIRECTION = re.compile(r"direction\.(.*)")


@dataclass(frozen=True)
class ControlVectorFile:
    """A control-vector file's directions (miLLM layer -> ``[d_model]`` float32) and its model hint."""

    directions: dict[int, torch.Tensor]
    model_hint: str


def write(path: Path, directions: Mapping[int, torch.Tensor], model_hint: str) -> None:
    """Write ``directions`` as a control-vector GGUF, whole or not at all: written beside ``path``, then renamed
    over it."""
    import gguf

    check_directions(directions)
    staging = path.with_name(f".{path.name}-{secrets.token_hex(6)}.tmp")  # created as any file is (umask)
    try:
        writer = gguf.GGUFWriter(staging, ARCH)
        try:
            writer.add_string(HINT_KEY, model_hint)
            writer.add_uint32(COUNT_KEY, len(directions))
            for layer in sorted(directions):
                writer.add_tensor(f"direction.{layer}", directions[layer].detach().cpu().float().numpy())
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
        os.replace(staging, path)
    except OSError as exc:
        raise InvalidParameter(f"{path}: cannot be written ({exc}).", param="file") from None
    finally:
        staging.unlink(missing_ok=True)


def check_directions(directions: Mapping[int, torch.Tensor]) -> None:
    """Directions llama.cpp can load: some, at layers from 1, one width, finite."""
    if not directions:
        raise InvalidParameter("Nothing to write: no layer has a direction.", param="file")
    widths = {int(v.numel()) for v in directions.values()}
    if min(directions) < 1:
        raise InvalidParameter("llama.cpp's control vectors start at layer 1: layer 0's output cannot be steered.",
                               param="layer")
    if len(widths) != 1 or any(v.ndim != 1 for v in directions.values()):
        raise InvalidParameter(f"The directions must be vectors of one width, got widths {sorted(widths)}.",
                               param="file")
    if not all(bool(torch.isfinite(v).all()) for v in directions.values()):
        raise InvalidParameter("A direction holds values that are not finite.", param="file")


def read(path: Path, n_layers: int, d_model: int) -> ControlVectorFile:
    """The control-vector file at ``path``, checked against a model of ``n_layers`` layers of width ``d_model``;
    what is wrong is a 400 naming the file."""
    import gguf

    if not path.is_file():
        raise InvalidParameter(f"{path}: no such file.", param="file")
    try:
        reader = gguf.GGUFReader(path)
    except Exception as exc:  # gguf-py reports a foreign or truncated file as whatever failed first
        raise InvalidParameter(f"{path}: not a GGUF file ({exc}).", param="file") from None
    arch = _string(reader, "general.architecture")
    if arch != ARCH:
        raise InvalidParameter(f"{path}: general.architecture is {arch!r}, not {ARCH!r}: not a control-vector file.",
                               param="file")
    directions = {}
    for tensor in reader.tensors:
        found = DIRECTION.fullmatch(tensor.name)
        if found is not None:
            layer = _layer(path, tensor.name, found.group(1), n_layers)
            directions[layer] = _vector(path, tensor, d_model)
    if not directions:
        raise InvalidParameter(f"{path}: no direction.N tensors: nothing to steer with.", param="file")
    return ControlVectorFile(directions, _string(reader, HINT_KEY))


def _string(reader: GGUFReader, key: str) -> str:
    field = reader.fields.get(key)
    return str(field.contents()) if field is not None else ""


def _layer(path: Path, name: str, index: str, n_layers: int) -> int:
    """The layer ``direction.INDEX`` steers: 1 to ``n_layers - 1``, as llama.cpp's loader takes it."""
    if not index.isdigit():
        raise InvalidParameter(f"{path}: tensor {name!r} does not name a layer (direction.N).", param="file")
    layer = int(index)
    if layer == 0:
        raise InvalidParameter(f"{path}: direction.0 steers layer 0's output, which llama.cpp's control vectors "
                               "cannot (they start at layer 1).", param="file")
    if layer >= n_layers:
        raise InvalidParameter(f"{path}: direction.{layer} is past the model's last layer ({n_layers - 1}).",
                               param="file")
    return layer


def _vector(path: Path, tensor: ReaderTensor, d_model: int) -> torch.Tensor:
    """A ``direction.N`` tensor as a float32 vector of the model's width (llama.cpp: F32, one dimension)."""
    import gguf

    if tensor.tensor_type != gguf.GGMLQuantizationType.F32 or sum(int(d) > 1 for d in tensor.shape) > 1:
        raise InvalidParameter(f"{path}: {tensor.name} is not a float32 vector (type {tensor.tensor_type.name}, "
                               f"shape {[int(d) for d in tensor.shape]}).", param="file")
    values = torch.from_numpy(np.array(tensor.data, dtype=np.float32).reshape(-1))
    if values.numel() != d_model:
        raise InvalidParameter(f"{path}: {tensor.name} holds {values.numel()} values; the model's d_model is "
                               f"{d_model}.", param="file")
    if not bool(torch.isfinite(values).all()):
        raise InvalidParameter(f"{path}: {tensor.name} holds values that are not finite.", param="file")
    return values


def set_directions(vs: VectorSet) -> dict[int, torch.Tensor]:
    """A one-vector set as a control vector: its unit vector at its layer (the user's scale is its strength)."""
    if len(vs.names) != 1:
        raise InvalidParameter(f"A control vector holds one direction per layer; this set holds {len(vs.names)} "
                               f"vectors ({', '.join(vs.names)}).", param="name")
    return {vs.layer: vs.vectors[0].float()}


def profile_directions(service: SteeringService, doc: ProfileDoc, model_id: str) -> dict[int, torch.Tensor]:
    """A profile's whole steering as one vector per layer: ``sum clamp(strength) * W_dec[feature]`` over its
    entries, as steering adds it. An entry's SAE or vector set steers at the layer it is attached to on
    ``model_id`` (persisted attachments; an entry naming a layer needs one), else at its own layer hint."""
    from millm.sae.formats import load_sae

    if doc.steering_scope != "all":
        raise InvalidParameter(f"Profile '{doc.name}' steers {doc.steering_scope} positions only; a control-vector "
                               "file applies to every position, so it cannot say that.", param="profile")
    attached = service.attached_layers(model_id)
    sums: dict[int, torch.Tensor] = {}
    for i, entry in enumerate(doc.entries):
        where = f"Profile '{doc.name}' entries[{i}]"
        sae_id, layer = _placed(service, attached, entry.sae, where)
        if layer == 0:
            raise InvalidParameter(f"{where}: SAE {sae_id} steers layer 0, which llama.cpp's control vectors "
                                   "cannot (they start at layer 1).", param="profile")
        sae = load_sae(service.sae(sae_id)["path"]).sae
        if sae.per_position:
            raise InvalidParameter(f"{where}: SAE {sae_id} scales its steering by each position's residual norm; a "
                                   "control vector is one fixed vector per layer.", param="profile")
        if entry.feature >= sae.d_sae:
            raise InvalidParameter(f"{where}: feature {entry.feature} is outside SAE {sae_id}'s 0-{sae.d_sae - 1}.",
                                   param="profile")
        width = next(iter(sums.values())).numel() if sums else sae.d_in
        if sae.d_in != width:
            raise InvalidParameter(f"{where}: SAE {sae_id} has d_in {sae.d_in}, the entries before it {width}: "
                                   "one control vector is one model's width.", param="profile")
        row = clamp(entry.strength) * sae.W_dec[entry.feature].float()
        sums[layer] = sums[layer] + row if layer in sums else row
    return sums


def _placed(service: SteeringService, attached: dict[str, int], ref: str | int, where: str) -> tuple[str, int]:
    """The SAE id a profile entry names and the layer it steers there."""
    if isinstance(ref, int):
        found = [sae_id for sae_id, layer in attached.items() if layer == ref]
        if not found:
            raise InvalidParameter(f"{where}: no SAE is attached to layer {ref}.", param="profile")
        return found[0], ref
    try:
        hint = service.sae(ref)["layer_hint"]
    except MillmError as exc:
        raise InvalidParameter(f"{where}: {exc.message}", param="profile") from None
    layer = attached.get(ref, hint)
    if layer is None:
        raise InvalidParameter(f"{where}: SAE {ref} is not attached and names no layer; attach it first.",
                               param="profile")
    return ref, int(layer)


def imported_sets(cv: ControlVectorFile, path: Path, name: str, model_id: str,
                  layer: int | None = None) -> list[VectorSet]:
    """The file's directions as vector sets of ``model_id``: one layer is one set named ``name``; several are
    ``name-L{layer}`` each, unless ``layer`` picks one. Each is stored at unit norm, its norm in the file kept
    in ``source`` (steering at that norm reproduces the file at scale 1)."""
    if layer is not None and layer not in cv.directions:
        raise InvalidParameter(f"{path} has no direction.{layer}; it holds layers "
                               f"{', '.join(map(str, sorted(cv.directions)))}.", param="layer")
    layers = [layer] if layer is not None else sorted(cv.directions)
    sets = []
    for at in layers:
        vector = cv.directions[at]
        norm = float(vector.norm())
        if not math.isfinite(norm) or norm == 0:
            raise InvalidParameter(f"{path}: direction.{at} has no direction (norm {norm}).", param="file")
        sets.append(VectorSet((set_name(name, at, layers),), (vector / norm)[None, :], at, model_id, "imported",
                              source={"file": str(path), "norm": norm, "model_hint": cv.model_hint}))
    return sets
