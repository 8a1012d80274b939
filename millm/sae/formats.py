"""Reading SAEs as published: SAELens (old and v6 configs), Gemma Scope npz, Llama Scope, EleutherAI sparsify.

Each reader returns an ``SAE`` plus what the files say about where it belongs (format, layer and
model hints). Anything malformed is an ``InvalidSAE`` naming the file and the key.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from millm.errors import InvalidSAE
from millm.sae.model import SAE


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


def _saelens(folder: Path) -> LoadedSAE:
    cfg_path, weights_path = folder / "cfg.json", folder / "sae_weights.safetensors"
    cfg = _json(cfg_path)
    meta = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
    d_in = _cfg_value(cfg, "d_in", cfg_path, int)
    d_sae = _cfg_value(cfg, "d_sae", cfg_path, int)
    arch = str(cfg.get("architecture") or cfg.get("activation_fn_str") or "standard").lower()
    arch = {"standard": "relu", "relu": "relu", "jumprelu": "jumprelu", "topk": "topk",
            "batchtopk": "jumprelu", "jumprelu_batchtopk": "jumprelu"}.get(arch)
    if arch is None:
        raise InvalidSAE(f"{cfg_path}: key 'architecture' is {cfg.get('architecture')!r}; miLLM reads standard "
                         "(ReLU), jumprelu, topk and batchtopk.")
    w = _tensors(weights_path)
    sae = SAE(
        W_enc=_shape(_need(w, "W_enc", weights_path), (d_in, d_sae), "W_enc", weights_path),
        b_enc=_shape(_need(w, "b_enc", weights_path), (d_sae,), "b_enc", weights_path),
        W_dec=_shape(_need(w, "W_dec", weights_path), (d_sae, d_in), "W_dec", weights_path),
        b_dec=_shape(_need(w, "b_dec", weights_path), (d_in,), "b_dec", weights_path),
        architecture=arch,
        apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", arch != "jumprelu")),
    )
    if arch == "jumprelu":
        if "threshold" in w:
            sae.threshold = _shape(_need(w, "threshold", weights_path), (d_sae,), "threshold", weights_path)
        elif isinstance(cfg.get("threshold"), (int, float)):  # BatchTopK saved with one global threshold
            sae.threshold = torch.full((d_sae,), float(cfg["threshold"]))
        else:
            raise InvalidSAE(f"{weights_path}: missing key 'threshold' for a {cfg.get('architecture')} SAE.")
    if arch == "topk":
        k = cfg.get("k", (cfg.get("activation_fn_kwargs") or {}).get("k"))
        if not isinstance(k, int) or k < 1:
            raise InvalidSAE(f"{cfg_path}: key 'k' must be a positive integer for a topk SAE, got {k!r}.")
        sae.k = k
    norm = cfg.get("normalize_activations") or "none"
    if norm == "expected_average_only_in":
        factor = cfg.get("norm_scaling_factor", meta.get("norm_scaling_factor"))
        if factor is not None:  # else SAELens folded it into the weights when saving
            sae.normalisation, sae.scale = "constant_scale", float(factor)
    elif norm in ("constant_norm_rescale", "layer_norm"):
        sae.normalisation = norm
    elif norm != "none":
        raise InvalidSAE(f"{cfg_path}: key 'normalize_activations' is {norm!r}, which miLLM does not know.")
    hook = cfg.get("hook_name", meta.get("hook_name"))
    layer = cfg.get("hook_layer", meta.get("hook_layer"))
    return LoadedSAE(sae, "saelens", layer if isinstance(layer, int) else _layer_from(hook),
                     cfg.get("model_name", meta.get("model_name")))


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


def _llama_scope(folder: Path, weights_path: Path) -> LoadedSAE:
    cfg_path = folder / "hyperparams.json"
    cfg = _json(cfg_path)
    w = _tensors(weights_path)
    enc = _need(w, "encoder.weight", weights_path)  # [d_sae, d_in]
    d_sae, d_in = enc.shape
    sae = SAE(W_enc=enc.T.contiguous(), b_enc=_shape(_need(w, "encoder.bias", weights_path), (d_sae,), "encoder.bias",
                                                      weights_path),
              W_dec=_shape(_need(w, "decoder.weight", weights_path), (d_in, d_sae), "decoder.weight",
                           weights_path).T.contiguous(),
              b_dec=_shape(_need(w, "decoder.bias", weights_path), (d_in,), "decoder.bias", weights_path),
              architecture="jumprelu", apply_b_dec_to_input=False)
    if "log_jumprelu_threshold" in w:
        sae.threshold = _shape(_need(w, "log_jumprelu_threshold", weights_path), (d_sae,),
                               "log_jumprelu_threshold", weights_path).exp()
    elif isinstance(cfg.get("jump_relu_threshold"), (int, float)):
        sae.threshold = torch.full((d_sae,), float(cfg["jump_relu_threshold"]))
    else:
        raise InvalidSAE(f"{cfg_path}: missing key 'jump_relu_threshold' (or tensor 'log_jumprelu_threshold').")
    if cfg.get("norm_activation") == "dataset-wise":
        norms = cfg.get("dataset_average_activation_norm")
        if not isinstance(norms, dict) or not isinstance(norms.get("in"), (int, float)):
            raise InvalidSAE(f"{cfg_path}: key 'dataset_average_activation_norm.in' is needed for dataset-wise "
                             "normalisation.")
        sae.normalisation, sae.scale = "constant_scale", d_in ** 0.5 / float(norms["in"])
    hook = cfg.get("hook_point_in")
    return LoadedSAE(sae, "llama-scope", _layer_from(hook), cfg.get("model_name"))


def _sparsify(folder: Path) -> LoadedSAE:
    cfg_path, weights_path = folder / "cfg.json", folder / "sae.safetensors"
    cfg = _json(cfg_path)
    if cfg.get("skip_connection"):
        raise InvalidSAE(f"{cfg_path}: key 'skip_connection' is true (a transcoder); miLLM steers SAEs only.")
    k = _cfg_value(cfg, "k", cfg_path, int)
    w = _tensors(weights_path)
    enc = _need(w, "encoder.weight", weights_path)
    d_sae, d_in = enc.shape
    sae = SAE(W_enc=enc.T.contiguous(),
              b_enc=_shape(_need(w, "encoder.bias", weights_path), (d_sae,), "encoder.bias", weights_path),
              W_dec=_shape(_need(w, "W_dec", weights_path), (d_sae, d_in), "W_dec", weights_path),
              b_dec=_shape(_need(w, "b_dec", weights_path), (d_in,), "b_dec", weights_path),
              architecture="topk", k=k, apply_b_dec_to_input=True)
    return LoadedSAE(sae, "sparsify", _layer_from(folder.name), None)


def load_sae(path: str | Path) -> LoadedSAE:
    """Read the SAE at ``path`` (a folder, or a Gemma Scope ``params.npz``), detecting its format."""
    path = Path(path).expanduser()
    if not path.exists():
        raise InvalidSAE(f"{path}: no such file or folder.")
    if path.is_file():
        if path.suffix == ".npz":
            return _gemma_scope(path)
        raise InvalidSAE(f"{path}: not an SAE file; give a folder, or a Gemma Scope params.npz.")
    if (path / "params.npz").is_file():
        return _gemma_scope(path / "params.npz")
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
