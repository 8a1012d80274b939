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

import os
import secrets
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from millm.errors import InvalidParameter, MillmError
from millm.sae.files import regular_file
from millm.sae.vector_sets import WEIGHTS_MAX_BYTES, VectorSet, check_layer, parse_layer, set_name, unit_rows
from millm.steering.profiles import ProfileDoc
from millm.steering.service import SteeringService
from millm.steering.values import clamp

if TYPE_CHECKING:
    from gguf import GGUFReader, ReaderTensor

ARCH = "controlvector"
HINT_KEY, COUNT_KEY = f"{ARCH}.model_hint", f"{ARCH}.layer_count"
DIRECTION = "direction."
HEADER_MAX_BYTES = 2**20  # a control vector's header: three keys and one tensor entry a layer, a few KiB
ITEMS_MAX = 4096  # metadata values, strings and tensors a header may hold in all
NAME_SHOWN = 64  # characters of a tensor name or key a refusal quotes (ASCII-escaped)


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


def read(path: Path, n_layers: int, d_model: int, shown: str | Path | None = None,
         param: str = "file") -> ControlVectorFile:
    """The control-vector file at ``path``, checked against a model of ``n_layers`` layers of width ``d_model``;
    what is wrong is a 400 naming the file as ``shown`` (the path as the client gave it; default ``path``) and
    the tensor, never the file's other contents. The header is walked within ``HEADER_MAX_BYTES`` and
    ``ITEMS_MAX`` before gguf-py reads it, so a file of millions of metadata values is refused at once."""
    import gguf

    shown = str(path if shown is None else shown)
    regular_file(path, shown, WEIGHTS_MAX_BYTES, param)
    check_header(path, shown, param)
    try:
        reader = gguf.GGUFReader(path)
    except Exception:  # gguf-py reports a foreign or truncated file as whatever failed first
        raise InvalidParameter(f"{shown}: not a GGUF file (gguf-py cannot read it).", param=param) from None
    arch = _string(reader, "general.architecture")
    if arch != ARCH:
        raise InvalidParameter(f"{shown}: general.architecture is {ascii(arch[:NAME_SHOWN])}, not {ARCH!r}: not a "
                               "control-vector file.", param=param)
    directions: dict[int, torch.Tensor] = {}
    for tensor in reader.tensors:
        if tensor.name.startswith(DIRECTION):
            layer = _layer(shown, tensor.name, n_layers, param)
            if layer in directions:
                raise InvalidParameter(f"{shown}: tensor {ascii(tensor.name[:NAME_SHOWN])} is a second direction for "
                                       f"layer {layer}.", param=param)
            directions[layer] = _vector(shown, tensor, layer, d_model, param)
    if not directions:
        raise InvalidParameter(f"{shown}: no direction.N tensors: nothing to steer with.", param=param)
    return ControlVectorFile(directions, _string(reader, HINT_KEY)[:NAME_SHOWN * 4])


def check_header(path: Path, shown: str, param: str) -> None:
    """Walk the GGUF header (metadata and tensor table) as the format lays it out, within ``HEADER_MAX_BYTES``
    and ``ITEMS_MAX`` values, tensors and strings in all: a control vector's is a few keys and a tensor a layer."""
    try:
        with path.open("rb") as f:
            data = f.read(HEADER_MAX_BYTES)
    except OSError as exc:
        raise InvalidParameter(f"{shown}: cannot be read ({exc.strerror}).", param=param) from None
    walk = _Walk(data, shown, param)
    if data[:4] != b"GGUF":
        raise walk.bad("it does not start with GGUF")
    version = walk.u32()
    if version not in (2, 3):
        walk.order = ">"  # a big-endian file's version reads byte-swapped
        walk.at = 4
        if walk.u32() not in (2, 3):
            raise walk.bad("its version is not 2 or 3")
    tensors, keys = walk.count(), walk.count()
    for _ in range(keys):
        walk.string()
        walk.value(walk.u32())
    for _ in range(tensors):
        walk.string()
        dims = walk.u32()
        if dims > 4:
            raise walk.bad("a tensor has more than 4 dimensions")
        walk.skip(8 * dims + 4 + 8)  # the dimensions, the type, the data offset


class _Walk:
    """A cursor over a GGUF header's bytes that counts what it passes and refuses to go past either bound."""

    SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUFValueType -> bytes
    STRING, ARRAY = 8, 9

    def __init__(self, data: bytes, shown: str, param: str) -> None:
        self.data, self.shown, self.param = data, shown, param
        self.at, self.items, self.order = 4, 0, "<"

    def bad(self, why: str) -> InvalidParameter:
        return InvalidParameter(f"{self.shown}: not a GGUF file ({why}).", param=self.param)

    def skip(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise self.bad("it ends inside its header" if len(self.data) < HEADER_MAX_BYTES else
                           f"its header is larger than {HEADER_MAX_BYTES} bytes")
        self.at += n
        return self.data[self.at - n:self.at]

    def u32(self) -> int:
        return int(struct.unpack(self.order + "I", self.skip(4))[0])

    def count(self, n: int = 1) -> int:
        """A u64 count of items, each taken from the budget of ``ITEMS_MAX`` (``n`` a piece)."""
        value = int(struct.unpack(self.order + "Q", self.skip(8))[0])
        self.take(value * n)
        return value

    def take(self, n: int) -> None:
        self.items += n
        if self.items > ITEMS_MAX:
            raise self.bad(f"its header holds more than {ITEMS_MAX} values, tensors and strings")

    def string(self) -> None:
        self.take(1)
        self.skip(int(struct.unpack(self.order + "Q", self.skip(8))[0]))

    def value(self, kind: int, depth: int = 0) -> None:
        if kind in self.SIZES:
            self.take(1)
            self.skip(self.SIZES[kind])
        elif kind == self.STRING:
            self.string()
        elif kind == self.ARRAY and depth < 2:
            item = self.u32()
            for _ in range(self.count()):
                self.value(item, depth + 1)
        else:
            raise self.bad("a metadata value has an unknown type")


def _string(reader: GGUFReader, key: str) -> str:
    field = reader.fields.get(key)
    if field is None:
        return ""
    try:
        return str(field.contents())
    except Exception:  # a value of another type, or bytes that are not UTF-8
        return ""


def _layer(shown: str, name: str, n_layers: int, param: str) -> int:
    """The layer ``direction.N`` steers: ASCII digits (as llama.cpp's loader reads them), 1 to ``n_layers - 1``."""
    layer = parse_layer(name[len(DIRECTION):])
    if layer is None:
        raise InvalidParameter(f"{shown}: tensor {ascii(name[:NAME_SHOWN])} does not name a layer (direction.N, N "
                               "in ASCII digits).", param=param)
    check_layer(layer, f"{shown}: direction.{layer}", param, n_layers)
    if layer == 0:
        raise InvalidParameter(f"{shown}: direction.0 steers layer 0's output, which llama.cpp's control vectors "
                               "cannot (they start at layer 1).", param=param)
    return layer


def _vector(shown: str, tensor: ReaderTensor, layer: int, d_model: int, param: str) -> torch.Tensor:
    """A ``direction.N`` tensor as a float32 vector of the model's width (llama.cpp: F32, one dimension), held to
    the rules every set's vectors pass (finite, not zero)."""
    import gguf

    where = f"{shown}: direction.{layer}"
    if tensor.tensor_type != gguf.GGMLQuantizationType.F32 or sum(int(d) > 1 for d in tensor.shape) > 1:
        raise InvalidParameter(f"{where} is not a float32 vector (type {tensor.tensor_type.name}, shape "
                               f"{[int(d) for d in tensor.shape]}).", param=param)
    values = torch.from_numpy(np.array(tensor.data, dtype=np.float32).reshape(-1))
    if values.numel() != d_model:
        raise InvalidParameter(f"{where} holds {values.numel()} values; the model's d_model is {d_model}.",
                               param=param)
    unit_rows(values[None, :], where, param)
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


def imported_sets(cv: ControlVectorFile, path: str | Path, name: str, model_id: str,
                  layer: int | None = None) -> list[VectorSet]:
    """The file's directions as vector sets of ``model_id``: one layer is one set named ``name``; several are
    ``name-L{layer}`` each, unless ``layer`` picks one. Each is stored at unit norm (``unit_rows``), its norm in
    the file, taken in float64, kept in ``source`` (steering at that norm reproduces the file at scale 1).
    ``path`` is the file as the client gave it, for refusals and the source."""
    if layer is not None and layer not in cv.directions:
        raise InvalidParameter(f"{path} has no direction.{layer}; it holds layers "
                               f"{', '.join(map(str, sorted(cv.directions)))}.", param="layer")
    layers = [layer] if layer is not None else sorted(cv.directions)
    sets = []
    for at in layers:
        vector = cv.directions[at][None, :]
        unit = unit_rows(vector, f"{path}: direction.{at}", "file")
        norm = float(vector.to(torch.float64).norm())  # float32 values square past float32's range; not float64's
        sets.append(VectorSet((set_name(name, at, layers),), unit, at, model_id, "imported",
                              source={"file": str(path), "norm": norm, "model_hint": cv.model_hint}))
    return sets
