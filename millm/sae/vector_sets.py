"""A vector set on disk, and how it steers: one or more named unit-norm directions at one layer's output.

A folder holds ``vectors.safetensors`` (``vectors``: ``[n, d_model]`` float32), ``vectors.json`` (what it is:
layer, model, method, how many examples, their hash) and ``labels.json`` (index -> name, what the SAE
registry reads). Read as an SAE of architecture ``linear`` (``W_dec`` the vectors, ``W_enc`` their
transpose, no biases), a vector set is registered, attached, steered and read by everything that takes an
SAE (profiles, clusters, circuits, the dial, the TUI, batch files, the management API, GGUF control
vectors): strength s adds s times the unit vector, as it adds s times a feature's decoder row, and its
"activation" is the residual's projection on it.

Every set passes the same rules on its way in, however it comes (learned, a folder, a GGUF control vector):
``check_names`` (each vector's name by the naming rule, once each), ``check_layer`` (an integer, or ASCII
digits, from 0 to below the model's layer count, or ``LAYERS_MAX`` when no model says), ``unit_rows`` (finite,
non-zero, stored at unit norm: a row of another norm is scaled to 1, its norm taken in float64 so no finite
float32 direction overflows). ``checked`` applies all three to a set in memory; ``load`` applies them to a
folder's files, and ``save`` to whatever it writes. A refusal is a 400 naming the file (as the client gave
it) and the key, never the file's contents.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from millm.errors import InvalidParameter
from millm.names import NAME_RULE, name_problem
from millm.sae.files import read_capped, regular_file
from millm.sae.model import SAE

FORMAT = "millm-vectors"
META_FILE, WEIGHTS_FILE, LABELS_FILE = "vectors.json", "vectors.safetensors", "labels.json"
METHODS = ("diffmean", "pca")
POSITIONS = ("mean", "last")
LAYERS_MAX = 1024  # the layer bound when no model gives one (the deepest open models have under 200 layers)
META_MAX_BYTES = 2**20  # vectors.json
WEIGHTS_MAX_BYTES = 256 * 2**20  # vectors.safetensors, or a control-vector GGUF: 4096 vectors of width 16384
HEADER_MAX_BYTES = 2**20  # a safetensors JSON header (one tensor's is under 200 bytes)
TEXT_MAX_CHARS = 256  # a model id, method or hash in vectors.json
COUNT_MAX = 2**31 - 1  # an example count in vectors.json
FLOAT_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
DIGITS = re.compile(r"[0-9]{1,9}")  # a layer written as text: ASCII digits only ('٣', '５', '+3', '1_0' are not)
UNIT_TOLERANCE = 1e-6  # a row this close to unit norm is kept bit for bit


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


# the rules every set passes on its way in
def check_names(names: object, where: str, param: str) -> tuple[str, ...]:
    """The vectors' names (the first is the set's, the others label its other vectors): a non-empty list of names
    by the naming rule, no two alike (ignoring case: ``--steer NAME=S`` must mean one vector)."""
    if not isinstance(names, (list, tuple)) or not names:
        raise InvalidParameter(f"{where} must be a non-empty list of names.", param=param)
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name_problem(name) is not None:
            raise InvalidParameter(f"{where}[{i}] must be a name of {NAME_RULE}.", param=param)
        if name.casefold() in seen:
            raise InvalidParameter(f"{where}[{i}] names a vector named before it.", param=param)
        seen.add(name.casefold())
    return tuple(names)


def parse_layer(text: str) -> int | None:
    """A layer written as text (a tensor name's suffix, a ``--layer`` part): ASCII digits, else None."""
    return int(text) if DIGITS.fullmatch(text) else None


def check_layer(layer: object, where: str, param: str, n_layers: int | None = None) -> int:
    """``layer`` when it is an integer (not a boolean) from 0 to below ``n_layers`` (``LAYERS_MAX`` when no model
    gives one); else a 400 naming ``where``."""
    bound = LAYERS_MAX if n_layers is None else n_layers
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise InvalidParameter(f"{where} must be a layer: an integer from 0 to {bound - 1}.", param=param)
    if layer >= bound:
        last = "the model's last layer" if n_layers is not None else "the last layer a set may name"
        raise InvalidParameter(f"{where} is past {last} ({bound - 1}).", param=param)
    return layer


def _is_matrix(vectors: torch.Tensor, rows: int | None) -> bool:
    """Whether ``vectors`` is a floating-point ``[rows, d_model]`` matrix with at least one row and one column (any
    number of rows when ``rows`` is None)."""
    if not vectors.is_floating_point() or vectors.ndim != 2 or vectors.shape[1] < 1 or vectors.shape[0] < 1:
        return False
    return rows is None or vectors.shape[0] == rows


def unit_rows(vectors: torch.Tensor, where: str, param: str, rows: int | None = None) -> torch.Tensor:
    """``vectors`` (``[rows, d_model]``, floating point) as float32 unit rows: every value finite and no row zero
    (a zero row has no direction; a NaN or infinite one steers every answer into non-finite logits). A row's
    norm is taken in float64 after scaling by its largest value, so no finite direction overflows; a row
    within ``UNIT_TOLERANCE`` of unit norm is kept as it is."""
    if not _is_matrix(vectors, rows):
        want = f"{rows} " if rows is not None else ""
        raise InvalidParameter(f"{where} must hold {want}floating-point vectors (a [vectors, d_model] matrix), "
                               f"not a {vectors.dtype} tensor of shape {list(vectors.shape)}.", param=param)
    wide = vectors.detach().cpu().to(torch.float64)
    if not bool(torch.isfinite(wide).all()):
        raise InvalidParameter(f"{where} holds values that are not finite (NaN or infinite).", param=param)
    scale = wide.abs().amax(dim=1, keepdim=True)
    zero = (scale[:, 0] == 0).nonzero()
    if len(zero):
        row = f" row {int(zero[0])}" if len(vectors) > 1 else ""
        raise InvalidParameter(f"{where}{row} has no direction (all zeros).", param=param)
    norms = scale * (wide / scale).norm(dim=1, keepdim=True)
    if bool(((norms - 1).abs() <= UNIT_TOLERANCE).all()) and vectors.dtype == torch.float32:
        return vectors.detach().cpu().contiguous()
    return (wide / norms).to(torch.float32)


def checked(vs: VectorSet, where: str, param: str, n_layers: int | None = None) -> VectorSet:
    """``vs`` by the rules every set passes (names, layer, finite non-zero vectors), at unit norm."""
    names = check_names(list(vs.names), f"{where} 'names'", param)
    check_layer(vs.layer, f"{where} 'layer'", param, n_layers)
    return replace(vs, vectors=unit_rows(vs.vectors, f"{where} 'vectors'", param, rows=len(names)))


def save(folder: Path, vs: VectorSet) -> None:
    """Write the set's folder whole or not at all: written beside it, then renamed into place. The set is held to
    the rules every set passes first (``checked``): nothing is written for one that breaks them."""
    from safetensors.torch import save_file

    vs = checked(vs, f"vector set {folder.name}", "name")
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    save_file({"vectors": vs.vectors.float().contiguous()}, str(staging / WEIGHTS_FILE))
    (staging / META_FILE).write_text(json.dumps(vs.meta(), indent=1) + "\n")
    (staging / LABELS_FILE).write_text(json.dumps({str(i): n for i, n in enumerate(vs.names)}, indent=1) + "\n")
    os.replace(staging, folder)


def is_vector_set(folder: Path) -> bool:
    return (folder / META_FILE).is_file() and (folder / WEIGHTS_FILE).is_file()


def shown_file(shown: str | Path, name: str) -> str:
    """The file ``name`` of the folder the client named ``shown``, as refusals name it."""
    return str(Path(shown) / name)


def _json_object(raw: bytes, where: str, param: str) -> dict[str, Any]:
    """``raw`` decoded as a UTF-8 JSON object; else a 400 naming ``where`` and what is wrong with it."""
    try:
        meta = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise InvalidParameter(f"{where}: is not UTF-8 text.", param=param) from None
    except json.JSONDecodeError as exc:
        raise InvalidParameter(f"{where}: is not JSON (line {exc.lineno}, column {exc.colno}).", param=param) \
            from None
    except RecursionError:
        raise InvalidParameter(f"{where}: nests too deep to read.", param=param) from None
    if not isinstance(meta, dict):
        raise InvalidParameter(f"{where}: must hold a JSON object, not {type(meta).__name__}.", param=param)
    return meta


def _check_format(meta: dict[str, Any], key: str, param: str) -> None:
    """``vectors.json``'s 'format' and 'version' say it is a miLLM vector set of version 1 (a boolean is no
    version, though ``True == 1``)."""
    if meta.get("format") != FORMAT:
        raise InvalidParameter(f"{key} 'format' must be {FORMAT!r}: not a miLLM vector set.", param=param)
    if meta.get("version", 1) != 1 or isinstance(meta.get("version"), bool):
        raise InvalidParameter(f"{key} 'version' must be 1.", param=param)


def _texts(meta: dict[str, Any], key: str, param: str) -> dict[str, str]:
    """'model', 'method' and 'sha256': each a string of at most ``TEXT_MAX_CHARS`` (default empty)."""
    out: dict[str, str] = {}
    for text in ("model", "method", "sha256"):
        value = meta.get(text, "")
        if not isinstance(value, str) or len(value) > TEXT_MAX_CHARS:
            raise InvalidParameter(f"{key} '{text}' must be a string of at most {TEXT_MAX_CHARS} characters.",
                                   param=param)
        out[text] = value
    return out


def _is_count(name: object, value: object) -> bool:
    """Whether ``name: value`` is an example count: 'positive' or 'negative', an integer (not a boolean) from 0 to
    ``COUNT_MAX``."""
    if name not in ("positive", "negative") or isinstance(value, bool) or not isinstance(value, int):
        return False
    return 0 <= value <= COUNT_MAX


def _position(meta: dict[str, Any], key: str, param: str) -> str:
    """'position', one of ``POSITIONS`` (default 'mean')."""
    position = meta.get("position", "mean")
    if position not in POSITIONS:
        raise InvalidParameter(f"{key} 'position' must be one of {', '.join(POSITIONS)}.", param=param)
    return position


def _examples(meta: dict[str, Any], key: str, param: str) -> dict[str, int]:
    """'examples', an object of 'positive' and 'negative' counts (default empty)."""
    examples = meta.get("examples", {})
    if not isinstance(examples, dict) or not all(_is_count(k, v) for k, v in examples.items()):
        raise InvalidParameter(f"{key} 'examples' must be an object of 'positive' and 'negative' counts.",
                               param=param)
    return examples


def _source(meta: dict[str, Any], key: str, param: str) -> dict[str, Any]:
    """'source', a JSON object (default empty)."""
    source = meta.get("source", {})
    if not isinstance(source, dict):
        raise InvalidParameter(f"{key} 'source' must be a JSON object.", param=param)
    return source


def _d_model(meta: dict[str, Any], names: tuple[str, ...], shape: tuple[int, int], where: str, weights: str,
             param: str) -> int:
    """The vectors' width: the ``vectors`` tensor (shape ``shape``, in the file shown as ``weights``) must hold one
    row per name, and 'd_model', when given, must be its width."""
    if shape[0] != len(names):
        raise InvalidParameter(f"{weights}: tensor 'vectors' holds {shape[0]} vectors; "
                               f"{where} key 'names' names {len(names)}.", param=param)
    d_model = meta.get("d_model", shape[1])
    if isinstance(d_model, bool) or d_model != shape[1]:
        raise InvalidParameter(f"{where}: key 'd_model' must be the vectors' width, {shape[1]}.", param=param)
    return shape[1]


def read_meta(folder: Path, shown: str | Path | None = None, param: str = "path",
              n_layers: int | None = None) -> dict[str, Any]:
    """The set's ``vectors.json``, every key checked, with ``d_model`` from ``vectors.safetensors``'s header
    (which must hold the ``vectors`` its names count); no tensor is read. ``shown`` is the folder as refusals
    name it (default: ``folder``)."""
    shown = folder if shown is None else shown
    where = shown_file(shown, META_FILE)
    meta = _json_object(read_capped(folder / META_FILE, where, META_MAX_BYTES, param), where, param)
    key = f"{where}: key"
    _check_format(meta, key, param)
    names = check_names(meta.get("names"), f"{key} 'names'", param)
    out: dict[str, Any] = {"names": names, "layer": check_layer(meta.get("layer"), f"{key} 'layer'", param, n_layers)}
    out.update(_texts(meta, key, param))
    out["position"] = _position(meta, key, param)
    out["examples"] = _examples(meta, key, param)
    out["source"] = _source(meta, key, param)
    weights = shown_file(shown, WEIGHTS_FILE)
    shape = _weights_shape(folder / WEIGHTS_FILE, weights, param)
    out["d_model"] = _d_model(meta, names, shape, where, weights, param)
    return out


def _read_header(file: Path, shown: str, size: int, param: str) -> tuple[object, int]:
    """The JSON header of the safetensors file ``file`` (``size`` bytes) and its length, the length checked to fit
    the file (and ``HEADER_MAX_BYTES``) before the header is read."""
    try:
        with file.open("rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if not 2 <= length <= min(HEADER_MAX_BYTES, size - 8):
                raise InvalidParameter(f"{shown}: is not a safetensors file (its header length, {length} bytes, "
                                       f"does not fit a {size}-byte file).", param=param)
            return json.loads(f.read(length).decode("utf-8")), length
    except OSError as exc:
        raise InvalidParameter(f"{shown}: cannot be read ({exc.strerror}).", param=param) from None
    except (ValueError, RecursionError):
        raise InvalidParameter(f"{shown}: is not a safetensors file (its header is not JSON).", param=param) \
            from None


def _is_float_matrix(info: dict[str, Any]) -> bool:
    """Whether a header's tensor entry declares a float dtype and a 2-D shape of positive integers."""
    shape = info.get("shape")
    if info.get("dtype") not in FLOAT_DTYPES or not isinstance(shape, list) or len(shape) != 2:
        return False
    return all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape)


def _offsets_fit(offsets: object, data_bytes: int) -> bool:
    """Whether a header's tensor entry's 'data_offsets' are two integers ending within the ``data_bytes`` that
    follow the header."""
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets):
        return False
    return offsets[1] <= data_bytes


def _weights_shape(file: Path, shown: str, param: str) -> tuple[int, int]:
    """The shape of the ``vectors`` tensor ``file``'s safetensors header declares, the header checked as the
    format lays it out (a length, then that many bytes of JSON, then the data it places) before any is read."""
    size = regular_file(file, shown, WEIGHTS_MAX_BYTES, param)
    header, length = _read_header(file, shown, size, param)
    info = header.get("vectors") if isinstance(header, dict) else None
    if not isinstance(info, dict):
        raise InvalidParameter(f"{shown}: holds no tensor 'vectors'.", param=param)
    if not _is_float_matrix(info):
        raise InvalidParameter(f"{shown}: tensor 'vectors' must be a [vectors, d_model] matrix of floats "
                               f"({', '.join(FLOAT_DTYPES)}).", param=param)
    if not _offsets_fit(info.get("data_offsets"), size - 8 - length):
        raise InvalidParameter(f"{shown}: tensor 'vectors' lies past the end of the file.", param=param)
    shape = info["shape"]
    return shape[0], shape[1]


def load(folder: Path, shown: str | Path | None = None, param: str = "path", n_layers: int | None = None) -> VectorSet:
    """The set in ``folder``, held to the rules every set passes (``read_meta``, then its vectors by
    ``unit_rows``); a malformed one is a 400 naming the file (as ``shown``, default ``folder``) and the key."""
    from safetensors import safe_open

    shown = folder if shown is None else shown
    meta = read_meta(folder, shown, param, n_layers)
    where = shown_file(shown, WEIGHTS_FILE)
    try:
        with safe_open(str(folder / WEIGHTS_FILE), framework="pt") as f:
            vectors = f.get_tensor("vectors")
    except Exception:  # safetensors reports a malformed file as SafetensorError, an OSError or a ValueError
        raise InvalidParameter(f"{where}: tensor 'vectors' cannot be read (not a safetensors file).",
                               param=param) from None
    vectors = unit_rows(vectors, f"{where} tensor 'vectors'", param, rows=len(meta["names"]))
    return VectorSet(meta["names"], vectors, meta["layer"], meta["model"], meta["method"], meta["position"],
                     dict(meta["examples"]), meta["sha256"], dict(meta["source"]))
