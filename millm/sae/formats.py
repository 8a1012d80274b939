"""Reading SAEs as published: SAELens (old and v6 configs), Gemma Scope npz, Llama Scope, EleutherAI sparsify;
and miLLM's vector sets, read as an SAE of their vectors (``millm.sae.vector_sets``).

Each reader returns an ``SAE`` that computes what the format's own library computes (encode, decode, and
so a feature's steering direction), plus what the files say about where it belongs (format, layer and
model hints). Anything malformed, or meaning something miLLM does not compute, is an ``InvalidSAE``
naming the file and the key.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from millm.errors import InvalidSAE
from millm.paths import user_path
from millm.sae import vector_sets  # a vector set reads as an SAE of its vectors
from millm.sae.model import SAE, fold_decoder_norms, fold_input_scale


@dataclass(frozen=True)
class LoadedSAE:
    sae: SAE
    format: str
    layer_hint: int | None
    model_hint: str | None


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidSAE(f"{path}: cannot read JSON ({exc}).") from None
    if not isinstance(data, dict):
        raise InvalidSAE(f"{path}: expected a JSON object.")
    return data


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises several types for bad files
        raise InvalidSAE(f"{path}: cannot read safetensors ({exc}).") from None


def _need(tensors: dict[str, Any], key: str, path: Path) -> torch.Tensor:
    if key not in tensors:
        raise InvalidSAE(f"{path}: missing key '{key}' (found: {', '.join(sorted(tensors)) or 'none'}).")
    return torch.as_tensor(tensors[key]).float()


def _shape(t: torch.Tensor, shape: tuple[int, ...], key: str, path: Path) -> torch.Tensor:
    if tuple(t.shape) != shape:
        raise InvalidSAE(f"{path}: '{key}' has shape {tuple(t.shape)}, expected {shape}.")
    return t


def _layer_from(text: str | None) -> int | None:
    if not text:
        return None
    match = re.search(r"(?:blocks|layers?|layer_)[._]?(\d+)", text)
    return int(match.group(1)) if match else None


def _cfg_value(cfg: dict[str, Any], key: str, path: Path, kind: type) -> Any:
    value = cfg.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise InvalidSAE(f"{path}: key '{key}' must be {kind.__name__}, got {value!r}.")
    return value


def _positive_int(value: Any, key: str, path: Path, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidSAE(f"{path}: key '{key}' must be a positive integer for {what}, got {value!r}.")
    return value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# SAELens

SAELENS_ARCHITECTURES = {"standard": "relu", "jumprelu": "jumprelu", "topk": "topk", "batchtopk": "jumprelu",
                         "jumprelu_batchtopk": "jumprelu"}
SAELENS_NORMALISATIONS = ("none", "expected_average_only_in", "constant_norm_rescale", "layer_norm")


def _saelens_major_version(cfg: dict[str, Any], meta: dict[str, Any], path: Path) -> int | None:
    version = cfg.get("sae_lens_version") or meta.get("sae_lens_version")
    if not version:
        return None
    match = re.match(r"\s*v?(\d+)", str(version))
    if not match:
        raise InvalidSAE(f"{path}: key 'sae_lens_version' is {version!r}, not a version number.")
    return int(match.group(1))


def _saelens_config(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """The config as SAELens' ``handle_config_defaulting`` reads it.

    A config without ``sae_lens_version`` (top level or in ``metadata``), or older than 6.0, goes through
    SAELens' pre-6.0 conversion: ``activation_fn_str`` "topk" with ``activation_fn_kwargs.k`` makes the
    architecture topk whatever ``architecture`` says, a missing ``apply_b_dec_to_input`` is true, a
    boolean ``normalize_activations`` true means ``expected_average_only_in``. A 6.x config is read as
    written, with SAELens' ``SAEConfig`` defaults (``apply_b_dec_to_input`` true, no normalisation).
    """
    meta: dict[str, Any] = raw["metadata"] if isinstance(raw.get("metadata"), dict) else {}
    cfg = {**raw}
    major = _saelens_major_version(raw, meta, path)
    if major is None or major < 6:
        _convert_pre6(cfg, path)
    elif not cfg.get("architecture"):
        raise InvalidSAE(f"{path}: key 'architecture' is missing (a SAELens {major}.x config names it).")
    cfg.setdefault("apply_b_dec_to_input", True)
    if cfg.get("normalize_activations") is None:
        cfg["normalize_activations"] = "none"
    for key in ("norm_scaling_factor", "hook_name", "hook_layer", "model_name"):
        if cfg.get(key) is None and key in meta:
            cfg[key] = meta[key]
    return cfg


def _convert_pre6(cfg: dict[str, Any], path: Path) -> None:
    """SAELens' pre-6.0 conversion of ``cfg``, in place (see ``_saelens_config``)."""
    activation = cfg.get("activation_fn", cfg.get("activation_fn_str")) or "relu"
    given = cfg.get("activation_fn_kwargs")
    kwargs: dict[str, Any] = given if isinstance(given, dict) else {}
    cfg["architecture"] = cfg.get("architecture") or "standard"
    cfg.setdefault("hook_name", cfg.get("hook_point"))  # renamed in 6.0
    if activation == "topk":
        cfg["architecture"] = "topk"
        cfg["k"] = _positive_int(kwargs.get("k"), "activation_fn_kwargs.k", path, "activation_fn_str 'topk'")
    elif activation != "relu":
        raise InvalidSAE(f"{path}: key 'activation_fn_str' is {activation!r}; miLLM reads relu and topk.")
    elif cfg["architecture"] == "topk" and "k" in kwargs:
        cfg["k"] = kwargs["k"]
    if isinstance(cfg.get("normalize_activations"), bool):
        cfg["normalize_activations"] = "expected_average_only_in" if cfg["normalize_activations"] else "none"


def _saelens_threshold(w: dict[str, torch.Tensor], cfg: dict[str, Any], d_sae: int, path: Path,
                       cfg_path: Path) -> torch.Tensor:
    """A JumpReLU threshold: the ``threshold`` tensor, an older ``log_threshold`` (SAELens exponentiates it
    on load), or BatchTopK's one global threshold (``topk_threshold`` tensor, or ``threshold`` in cfg.json)."""
    if "threshold" in w:
        return _shape(_need(w, "threshold", path), (d_sae,), "threshold", path)
    if "log_threshold" in w:
        return _shape(_need(w, "log_threshold", path), (d_sae,), "log_threshold", path).exp()
    if "topk_threshold" in w:
        return torch.full((d_sae,), float(_need(w, "topk_threshold", path).reshape(-1)[0]))
    if _number(cfg.get("threshold")):
        return torch.full((d_sae,), float(cfg["threshold"]))
    raise InvalidSAE(f"{path}: missing key 'threshold' for a {cfg.get('architecture')} SAE (nor 'threshold' in "
                     f"{cfg_path.name}).")


def _saelens_kind(cfg: dict[str, Any], cfg_path: Path) -> tuple[str, str, str]:
    """The config's architecture as written (lower case), as miLLM runs it, and its normalisation."""
    name = str(cfg["architecture"]).lower()
    arch = SAELENS_ARCHITECTURES.get(name)
    if arch is None:
        raise InvalidSAE(f"{cfg_path}: key 'architecture' is {cfg['architecture']!r}; miLLM reads standard "
                         "(ReLU), jumprelu, topk and batchtopk.")
    norm = cfg["normalize_activations"]
    if norm not in SAELENS_NORMALISATIONS:
        raise InvalidSAE(f"{cfg_path}: key 'normalize_activations' is {norm!r}; SAELens knows "
                         f"{', '.join(SAELENS_NORMALISATIONS)}.")
    return name, arch, norm


def _saelens_folded(sae: SAE, cfg: dict[str, Any], name: str, cfg_path: Path) -> SAE:
    """``sae`` with what SAELens applies at run time folded in: decoder norms (TopK and BatchTopK rescaled by
    them) and a recorded input scale."""
    if name in ("topk", "batchtopk") and cfg.get("rescale_acts_by_decoder_norm"):
        sae = fold_decoder_norms(sae)  # TopK selects, and BatchTopK thresholds, pre * ||W_dec[i]||
    factor = cfg.get("norm_scaling_factor")
    if cfg["normalize_activations"] == "expected_average_only_in" and factor is not None:
        if not _number(factor) or factor <= 0:
            raise InvalidSAE(f"{cfg_path}: key 'norm_scaling_factor' must be a positive number, got {factor!r}.")
        sae = fold_input_scale(sae, float(factor))
    # expected_average_only_in without a recorded factor: the factor was folded in when saving, or lives only
    # in SAELens' pretrained registry; SAELens' load_from_disk applies nothing either.
    return sae


def _saelens(folder: Path) -> LoadedSAE:
    cfg_path, weights_path = folder / "cfg.json", folder / "sae_weights.safetensors"
    cfg = _saelens_config(_json(cfg_path), cfg_path)
    d_in = _cfg_value(cfg, "d_in", cfg_path, int)
    d_sae = _cfg_value(cfg, "d_sae", cfg_path, int)
    name, arch, norm = _saelens_kind(cfg, cfg_path)
    w = _tensors(weights_path)
    if "scaling_factor" in w and not torch.all(w["scaling_factor"] == 1):
        raise InvalidSAE(f"{weights_path}: key 'scaling_factor' is a finetuning scaling factor, which SAELens 6 "
                         "does not apply either; miLLM does not read it.")
    sae = SAE(
        W_enc=_shape(_need(w, "W_enc", weights_path), (d_in, d_sae), "W_enc", weights_path),
        b_enc=_shape(_need(w, "b_enc", weights_path), (d_sae,), "b_enc", weights_path),
        W_dec=_shape(_need(w, "W_dec", weights_path), (d_sae, d_in), "W_dec", weights_path),
        b_dec=_shape(_need(w, "b_dec", weights_path), (d_in,), "b_dec", weights_path),
        architecture=arch,
        threshold=_saelens_threshold(w, cfg, d_sae, weights_path, cfg_path) if arch == "jumprelu" else None,
        k=_positive_int(cfg.get("k"), "k", cfg_path, "a topk SAE") if arch == "topk" else None,
        apply_b_dec_to_input=bool(cfg["apply_b_dec_to_input"]),
        normalisation=norm if norm in ("constant_norm_rescale", "layer_norm") else "none",
    )
    sae = _saelens_folded(sae, cfg, name, cfg_path)
    hook, layer = cfg.get("hook_name"), cfg.get("hook_layer")
    return LoadedSAE(sae, "saelens", layer if isinstance(layer, int) else _layer_from(hook), cfg.get("model_name"))


# Gemma Scope

def _gemma_scope(path: Path) -> LoadedSAE:
    import numpy as np

    try:
        params = dict(np.load(path))
    except (OSError, ValueError) as exc:
        raise InvalidSAE(f"{path}: cannot read npz ({exc}).") from None
    W_enc = _need(params, "W_enc", path)
    d_in, d_sae = W_enc.shape
    sae = SAE(W_enc=W_enc, b_enc=_shape(_need(params, "b_enc", path), (d_sae,), "b_enc", path),
              W_dec=_shape(_need(params, "W_dec", path), (d_sae, d_in), "W_dec", path),
              b_dec=_shape(_need(params, "b_dec", path), (d_in,), "b_dec", path),
              architecture="jumprelu", threshold=_shape(_need(params, "threshold", path), (d_sae,), "threshold", path),
              apply_b_dec_to_input=False)
    return LoadedSAE(sae, "gemma-scope", _layer_from(str(path)), None)


# Llama Scope (OpenMOSS lm-saes)

def _lm_saes_inference(sae: SAE, factor: float) -> SAE:
    """lm-saes' ``standardize_parameters_of_dataset_norm`` for an SAE whose input and output share a hook:
    the SAE reads raw residuals, ``b_enc``, ``b_dec`` and thresholds are divided by the dataset-wise factor,
    and activations come out in the raw residual's units (lm-saes' "inference" mode)."""
    threshold = None if sae.threshold is None else sae.threshold / factor
    return replace(sae, b_enc=sae.b_enc / factor, b_dec=sae.b_dec / factor, threshold=threshold)


def _llama_scope_factor(cfg: dict[str, Any], d_in: int, cfg_path: Path) -> float:
    """The training space's input scale: sqrt(d_model) / ``dataset_average_activation_norm.in`` (dataset-wise), or
    1 (inference)."""
    norm_mode = cfg.get("norm_activation", "token-wise")
    if norm_mode == "inference":
        return 1.0
    if norm_mode != "dataset-wise":
        raise InvalidSAE(f"{cfg_path}: key 'norm_activation' is {norm_mode!r}; miLLM reads Llama Scope's "
                         "dataset-wise and inference.")
    norms = cfg.get("dataset_average_activation_norm")
    if not isinstance(norms, dict) or not _number(norms.get("in")) or norms["in"] <= 0:
        raise InvalidSAE(f"{cfg_path}: key 'dataset_average_activation_norm.in' must be a positive number for "
                         "dataset-wise normalisation.")
    return float(d_in ** 0.5 / float(norms["in"]))


def _llama_scope_activation(cfg: dict[str, Any], w: dict[str, torch.Tensor], d_sae: int, factor: float,
                            cfg_path: Path, weights_path: Path) -> tuple[str, torch.Tensor | None, int | None]:
    """The architecture lm-saes runs, with its threshold (in the raw residual's units) or k."""
    act = str(cfg.get("act_fn", "relu")).lower()
    scalar = cfg.get("jump_relu_threshold", 0.0)
    if not _number(scalar):
        raise InvalidSAE(f"{cfg_path}: key 'jump_relu_threshold' must be a number, got {scalar!r}.")
    if "log_jumprelu_threshold" in w:
        return "jumprelu", _shape(_need(w, "log_jumprelu_threshold", weights_path), (d_sae,),
                                  "log_jumprelu_threshold", weights_path).exp(), None
    if act == "jumprelu" or (act == "topk" and scalar > 0):  # lm-saes runs a thresholded topk as jumprelu
        return "jumprelu", torch.full((d_sae,), float(scalar) * factor), None
    if act == "topk":
        return act, None, _positive_int(cfg.get("top_k", 50), "top_k", cfg_path, "act_fn topk")
    if act != "relu":
        raise InvalidSAE(f"{cfg_path}: key 'act_fn' is {act!r}; miLLM reads jumprelu, topk and relu.")
    return act, None, None


def _llama_scope(folder: Path, weights_path: Path) -> LoadedSAE:
    """Llama Scope as lm-saes runs it for inference (its Initializer, state "inference").

    The weights are stored in the training space, where inputs are scaled by sqrt(d_model) /
    ``dataset_average_activation_norm.in``. lm-saes folds that factor into the biases, makes the decoder
    rows unit length (``sparsity_include_decoder_norm``, default true), and then applies
    ``jump_relu_threshold`` from hyperparams.json as it stands: that threshold is in the raw residual's
    units (it was measured on the folded SAE), which is the space miLLM's activations are in too. A
    ``log_jumprelu_threshold`` tensor (newer lm-saes) is in the training space and is folded with the rest.
    """
    cfg_path = folder / "hyperparams.json"
    cfg = _json(cfg_path)
    hook_in = cfg.get("hook_point_in")
    if cfg.get("hook_point_out", hook_in) != hook_in:
        raise InvalidSAE(f"{cfg_path}: key 'hook_point_out' ({cfg.get('hook_point_out')!r}) differs from "
                         f"'hook_point_in' ({hook_in!r}): a transcoder, which miLLM does not steer with.")
    w = _tensors(weights_path)
    enc = _need(w, "encoder.weight", weights_path)  # [d_sae, d_in]
    d_sae, d_in = enc.shape
    use_bias = cfg.get("use_decoder_bias", True) is not False
    b_dec = _shape(_need(w, "decoder.bias", weights_path), (d_in,), "decoder.bias", weights_path) if use_bias \
        else torch.zeros(d_in)
    factor = _llama_scope_factor(cfg, d_in, cfg_path)
    arch, threshold, k = _llama_scope_activation(cfg, w, d_sae, factor, cfg_path, weights_path)
    sae = SAE(W_enc=enc.T.contiguous(),
              b_enc=_shape(_need(w, "encoder.bias", weights_path), (d_sae,), "encoder.bias", weights_path),
              W_dec=_shape(_need(w, "decoder.weight", weights_path), (d_in, d_sae), "decoder.weight",
                           weights_path).T.contiguous(),
              b_dec=b_dec, architecture=arch, threshold=threshold, k=k,
              apply_b_dec_to_input=use_bias and cfg.get("apply_decoder_bias_to_pre_encoder", True) is not False)
    if cfg.get("sparsity_include_decoder_norm", True) is not False:
        sae = fold_decoder_norms(sae)
    return LoadedSAE(_lm_saes_inference(sae, factor), "llama-scope", _layer_from(hook_in), cfg.get("model_name"))


# EleutherAI sparsify

SPARSIFY_REFUSED = {
    "transcode": "a transcoder (it predicts a module's output from its input)",
    "skip_connection": "a skip transcoder (it adds a linear skip path to the output)",
    "embed_skip": "a coder with an embedding skip path added to its output",
    "gram_lookup": "a coder that subtracts an n-gram table from its input and target",
}


def _sparsify(folder: Path) -> LoadedSAE:
    """sparsify's ``SparseCoder``: ``x - b_dec`` encoded with ReLU then topk, or groupmax (the largest of each
    of k contiguous groups of latents), decoded as ``acts @ W_dec + b_dec``."""
    cfg_path, weights_path = folder / "cfg.json", folder / "sae.safetensors"
    cfg = _json(cfg_path)
    for key, what in SPARSIFY_REFUSED.items():
        if cfg.get(key):
            raise InvalidSAE(f"{cfg_path}: key '{key}' is true: {what}; miLLM steers with SAEs only.")
    activation = cfg.get("activation", "topk")
    if activation not in ("topk", "groupmax"):
        raise InvalidSAE(f"{cfg_path}: key 'activation' is {activation!r}; sparsify knows topk and groupmax.")
    k = _positive_int(cfg.get("k"), "k", cfg_path, f"a {activation} coder")
    w = _tensors(weights_path)
    enc = _need(w, "encoder.weight", weights_path)
    d_sae, d_in = enc.shape
    if activation == "groupmax" and d_sae % k:
        raise InvalidSAE(f"{cfg_path}: key 'k' ({k}) must divide the number of latents ({d_sae}) for groupmax.")
    sae = SAE(W_enc=enc.T.contiguous(),
              b_enc=_shape(_need(w, "encoder.bias", weights_path), (d_sae,), "encoder.bias", weights_path),
              W_dec=_shape(_need(w, "W_dec", weights_path), (d_sae, d_in), "W_dec", weights_path),
              b_dec=_shape(_need(w, "b_dec", weights_path), (d_in,), "b_dec", weights_path),
              architecture=activation, k=k, apply_b_dec_to_input=True)
    return LoadedSAE(sae, "sparsify", _layer_from(folder.name), None)


def load_sae(path: str | Path) -> LoadedSAE:
    """Read the SAE at ``path`` (a folder, or a Gemma Scope ``params.npz``), detecting its format."""
    path = user_path(path)
    if not path.exists():
        raise InvalidSAE(f"{path}: no such file or folder.")
    if path.is_file():
        if path.suffix == ".npz":
            return _gemma_scope(path)
        raise InvalidSAE(f"{path}: not an SAE file; give a folder, or a Gemma Scope params.npz.")
    return _load_folder(path)


def _load_folder(path: Path) -> LoadedSAE:
    """The SAE in the folder ``path``, by the files it holds."""
    if (path / "params.npz").is_file():
        return _gemma_scope(path / "params.npz")
    if vector_sets.is_vector_set(path):
        vs = vector_sets.load(path)
        return LoadedSAE(vs.as_sae(), "vectors", vs.layer, vs.model or None)
    if (path / "sae_weights.safetensors").is_file():
        return _saelens(path)
    if (path / "sae.safetensors").is_file():
        return _sparsify(path)
    if (path / "hyperparams.json").is_file():
        weights = sorted(path.glob("*.safetensors")) + sorted(path.glob("checkpoints/*.safetensors"))
        if weights:
            return _llama_scope(path, weights[0])
    raise InvalidSAE(f"{path}: no SAE found (looked for cfg.json + sae_weights.safetensors, params.npz, "
                     "cfg.json + sae.safetensors, hyperparams.json + *.safetensors).")

