"""SAE files mean in miLLM what they mean in their authors' libraries.

Each case writes an SAE in its library's exact on-disk layout from known weights (decoder rows not unit
length, non-trivial biases), loads it with ``load_sae``, and compares encode, the set of active features,
decode, and what ``Steering`` adds to the residual for feature i at strength s (per position where the
SAE normalises per position) with a reference written here from the library's own code:

- SAELens 6: ``sae_lens/saes/sae.py`` (``run_time_activation_norm_fn_in/out``,
  ``fold_activation_norm_scaling_factor``), ``standard_sae.py``, ``jumprelu_sae.py``, ``topk_sae.py``
  (``rescale_acts_by_decoder_norm``) and the pre-6.0 conversion ``handle_pre_6_0_config`` in
  ``sae_lens/loading/pretrained_sae_loaders.py``;
- EleutherAI sparsify: ``sparsify/sparse_coder.py`` and ``fused_encoder.py`` (topk, groupmax);
- OpenMOSS lm-saes (Llama Scope): the inference path of its Initializer, ``standardize_parameters_of_dataset_norm``
  then ``transform_to_unit_decoder_norm``, then JumpReLU with the stored ``jump_relu_threshold``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from millm.errors import InvalidSAE
from tests.steering.tiny import as_scheduled
from tests.support.saes import write_llama_scope, write_saelens_files, write_sparsify

if TYPE_CHECKING:
    import torch
    from transformers import LlamaForCausalLM

    from millm.sae.model import SAE
    from millm.steering.controller import Steering

D_IN, D_SAE, K = 64, 256, 8
FEATURE, STRENGTH = 37, 3.0
V6 = {"sae_lens_version": "6.54.0", "hook_name": "blocks.0.hook_resid_post", "model_name": "tiny"}

Encode = Callable[["torch.Tensor"], "torch.Tensor"]
Decode = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """Known weights: decoder rows of lengths 0.3-2.3, biases well away from zero."""
    import torch

    g = torch.Generator().manual_seed(seed)
    W_dec = torch.randn(D_SAE, D_IN, generator=g)
    W_dec = W_dec / W_dec.norm(dim=-1, keepdim=True) * (0.3 + 2 * torch.rand(D_SAE, 1, generator=g))
    return {"W_enc": torch.randn(D_IN, D_SAE, generator=g) / 4, "b_enc": torch.randn(D_SAE, generator=g) * 0.3,
            "W_dec": W_dec, "b_dec": torch.randn(D_IN, generator=g) * 0.5}


def inputs(seed: int = 1, offset: float = 0.0, spread: float = 1.0) -> torch.Tensor:
    """Residuals ``[3, 7, d_in]`` whose norms differ from position to position."""
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 7, D_IN, generator=g) * spread
    return x * (0.5 + 2.5 * torch.rand(3, 7, 1, generator=g)) + offset


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    import torch

    torch.testing.assert_close(got, want, atol=1e-4, rtol=0.0)


# references

@dataclass
class SAELensRef:
    """SAELens 6 inference (encode/decode of StandardSAE, JumpReLUSAE, TopKSAE), written out."""

    w: dict[str, torch.Tensor]
    arch: str = "standard"
    k: int | None = None
    threshold: torch.Tensor | None = None
    apply_b_dec: bool = True
    norm: str = "none"
    factor: float | None = None  # a recorded norm_scaling_factor, folded as fold_activation_norm_scaling_factor
    rescale: bool = False

    def norm_in(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm == "constant_norm_rescale":
            return x * D_IN ** 0.5 / x.norm(dim=-1, keepdim=True)
        if self.norm == "layer_norm":
            centred = x - x.mean(dim=-1, keepdim=True)
            return centred / (centred.std(dim=-1, keepdim=True) + 1e-5)
        return x * self.factor if self.factor else x

    def norm_out(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.norm == "constant_norm_rescale":
            return out / (D_IN ** 0.5 / x.norm(dim=-1, keepdim=True))
        if self.norm == "layer_norm":
            mean = x.mean(dim=-1, keepdim=True)
            return out * (x - mean).std(dim=-1, keepdim=True) + mean
        return out / self.factor if self.factor else out

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        import torch

        sae_in = self.norm_in(x) - (self.w["b_dec"] if self.apply_b_dec else 0)
        pre = sae_in @ self.w["W_enc"] + self.w["b_enc"]
        if self.arch == "topk":
            assert self.k is not None
            if self.rescale:
                pre = pre * self.w["W_dec"].norm(dim=-1)
            top = pre.topk(self.k, dim=-1)
            return torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
        if self.arch == "jumprelu":
            assert self.threshold is not None
            return pre.relu() * (pre > self.threshold.relu())
        return pre.relu()

    def decode(self, acts: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.rescale:
            acts = acts / self.w["W_dec"].norm(dim=-1)
        return self.norm_out(acts @ self.w["W_dec"] + self.w["b_dec"], x)


def sparsify_ref(w: dict[str, torch.Tensor], activation: str, k: int) -> tuple[Encode, Decode]:
    """SparseCoder.encode (x - b_dec, fused_encoder: ReLU then topk or groupmax) and decode."""
    import torch

    def encode(x: torch.Tensor) -> torch.Tensor:
        pre = torch.relu((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"])
        if activation == "topk":
            values, indices = pre.topk(k, dim=-1)
        else:
            values, within = pre.unflatten(-1, (k, -1)).max(dim=-1)
            indices = torch.arange(0, D_SAE, D_SAE // k) + within
        return torch.zeros_like(pre).scatter(-1, indices, values)

    return encode, lambda acts, x: acts @ w["W_dec"] + w["b_dec"]


def lm_saes_ref(w: dict[str, torch.Tensor], norm_in: float, threshold: float,
                apply_b_dec: bool) -> tuple[Encode, Decode]:
    """lm-saes' Initializer in state "inference" on a Llama Scope hyperparams.json (dataset-wise, jumprelu,
    sparsity_include_decoder_norm): standardize, unit decoder, then the stored threshold, on raw residuals."""
    factor = D_IN ** 0.5 / norm_in
    W_E, b_E = w["W_enc"].T.clone(), w["b_enc"] / factor  # encoder.weight [d_sae, d_in]
    W_D, b_D = w["W_dec"].T.clone() * factor / factor, w["b_dec"] / factor  # decoder.weight [d_in, d_sae]
    norms = W_D.norm(dim=0)
    W_D, W_E, b_E = W_D / norms, W_E * norms[:, None], b_E * norms

    def encode(x: torch.Tensor) -> torch.Tensor:
        hidden = (x - b_D if apply_b_dec else x) @ W_E.T + b_E
        return hidden.where(hidden > threshold, 0)

    return encode, lambda acts, x: acts @ W_D.T + b_D


# the steering harness

@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=100, hidden_size=D_IN, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    return LlamaForCausalLM(config).eval()


def prompt_ids() -> torch.Tensor:
    import torch

    return torch.tensor([[5, 17, 42, 8, 99, 3, 61, 12], [7, 7, 30, 2, 88, 45, 19, 70]])


def layer0(model: LlamaForCausalLM, steering: Steering) -> torch.Tensor:
    """Layer 0's output as the next layer sees it (recorded after any steering hook), in a forward run as the
    scheduler runs one."""
    import torch

    seen: list[torch.Tensor] = []
    handle = model.model.layers[0].register_forward_hook(
        lambda m, a, o: seen.append((o[0] if isinstance(o, tuple) else o).clone()))
    ids = prompt_ids()
    with torch.inference_mode(), as_scheduled(steering, ids.shape[0]):
        model(ids)
    handle.remove()
    return seen[0]


def steering_added(model: LlamaForCausalLM, sae: SAE) -> tuple[torch.Tensor, torch.Tensor]:
    """(the unsteered residual at layer 0, what steering FEATURE at STRENGTH adds to it at each position)."""
    from millm.steering.controller import Steering

    steering = Steering(model)
    att = steering.attach("sae", sae, layer=0)
    base = layer0(model, steering)
    pointer = att.delta.data_ptr()
    steering.set_values("sae", {FEATURE: STRENGTH}, merge=False)
    steered = layer0(model, steering)
    assert att.delta.data_ptr() == pointer  # the preallocated buffer is rewritten in place, never replaced
    steering.detach_all()
    return base, steered - base


def reference_delta(encode: Encode, decode: Decode, x: torch.Tensor) -> torch.Tensor:
    """The library's own answer: decode(acts + s e_i, x) - decode(acts, x)."""
    acts = encode(x)
    bumped = acts.clone()
    bumped[..., FEATURE] += STRENGTH
    return decode(bumped, x) - decode(acts, x)


def check(loaded: SAE, encode: Encode, decode: Decode, model: LlamaForCausalLM, x: torch.Tensor) -> None:
    import torch

    want = encode(x)
    got = loaded.encode(x)
    assert torch.equal(got > 0, want > 0), "active sets differ"
    close(got, want)
    close(loaded.decode(want, x), decode(want, x))
    base, added = steering_added(model, loaded)
    close(added, reference_delta(encode, decode, base))


def saelens_cfg(**cfg) -> dict:
    return {"d_in": D_IN, "d_sae": D_SAE, "dtype": "float32", "device": "cpu", **cfg}


def saelens_tensors(w: dict[str, torch.Tensor], threshold: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    return {**w, **({"threshold": threshold} if threshold is not None else {})}


# 1. TopK with rescale_acts_by_decoder_norm

@pytest.mark.parametrize("apply_b_dec", [True, False])
def test_saelens_topk_rescaled_by_decoder_norm(tmp_path: Path, model, apply_b_dec: bool) -> None:
    import torch

    from millm.sae.formats import load_sae

    w = weights()
    cfg = saelens_cfg(architecture="topk", k=K, rescale_acts_by_decoder_norm=True, apply_b_dec_to_input=apply_b_dec,
                      normalize_activations="none", metadata=V6)
    loaded = load_sae(write_saelens_files(tmp_path / "s", w, cfg)).sae
    ref = SAELensRef(w, "topk", k=K, apply_b_dec=apply_b_dec, rescale=True)
    check(loaded, ref.encode, ref.decode, model, inputs())
    unscaled = SAELensRef(w, "topk", k=K, apply_b_dec=apply_b_dec).encode(inputs())
    assert not torch.equal(unscaled > 0, ref.encode(inputs()) > 0)  # the rescale changes which features win


# 2. pre-6.0 configs: architecture "standard" with activation_fn_str "topk"

def test_saelens_pre6_standard_with_topk_activation(tmp_path: Path, model) -> None:
    from millm.sae.formats import load_sae

    w = weights(2)
    cfg = saelens_cfg(architecture="standard", activation_fn_str="topk", activation_fn_kwargs={"k": K},
                      apply_b_dec_to_input=True, hook_name="blocks.0.hook_resid_post", sae_lens_version="5.3.0")
    loaded = load_sae(write_saelens_files(tmp_path / "s", w, cfg))
    assert loaded.sae.architecture == "topk" and loaded.layer_hint == 0
    ref = SAELensRef(w, "topk", k=K)
    check(loaded.sae, ref.encode, ref.decode, model, inputs())
    assert ((loaded.sae.encode(inputs()) > 0).sum(-1) == K).all()


def test_saelens_pre6_topk_without_k_is_refused(tmp_path: Path) -> None:
    from millm.sae.formats import load_sae

    cfg = saelens_cfg(architecture="standard", activation_fn_str="topk")
    with pytest.raises(InvalidSAE, match=r"cfg.json: key 'activation_fn_kwargs.k'"):
        load_sae(write_saelens_files(tmp_path / "s", weights(), cfg))


# 3. sparsify groupmax, and transcoders refused

@pytest.mark.parametrize("activation", ["groupmax", "topk"])
def test_sparsify(tmp_path: Path, model, activation: str) -> None:
    from millm.sae.formats import load_sae
    from millm.sae.model import SAE

    w = weights(3)
    sae = SAE(W_enc=w["W_enc"], b_enc=w["b_enc"], W_dec=w["W_dec"], b_dec=w["b_dec"], architecture="topk", k=K)
    loaded = load_sae(write_sparsify(tmp_path / "layers.0", sae, activation=activation, normalize_decoder=False))
    assert loaded.sae.architecture == activation
    encode, decode = sparsify_ref(w, activation, K)
    check(loaded.sae, encode, decode, model, inputs())
    if activation == "groupmax":  # one winner per group of D_SAE // K contiguous latents
        groups = (loaded.sae.encode(inputs()) > 0).unflatten(-1, (K, -1)).sum(-1)
        assert (groups <= 1).all() and groups.sum() > 0


@pytest.mark.parametrize(("key", "message"), [("transcode", "transcoder"), ("skip_connection", "skip transcoder")])
def test_sparsify_transcoders_refused(tmp_path: Path, key: str, message: str) -> None:
    from millm.sae.formats import load_sae
    from millm.sae.model import SAE

    w = weights()
    sae = SAE(W_enc=w["W_enc"], b_enc=w["b_enc"], W_dec=w["W_dec"], b_dec=w["b_dec"], architecture="topk", k=K)
    with pytest.raises(InvalidSAE, match=rf"cfg.json: key '{key}' is true: a {message}"):
        load_sae(write_sparsify(tmp_path / "layers.0", sae, **{key: True}))


def test_sparsify_groupmax_needs_k_dividing_width(tmp_path: Path) -> None:
    from millm.sae.formats import load_sae
    from millm.sae.model import SAE

    w = weights()
    sae = SAE(W_enc=w["W_enc"], b_enc=w["b_enc"], W_dec=w["W_dec"], b_dec=w["b_dec"], architecture="topk", k=7)
    with pytest.raises(InvalidSAE, match=r"key 'k' \(7\) must divide"):
        load_sae(write_sparsify(tmp_path / "layers.0", sae, activation="groupmax"))


# 4. a recorded norm_scaling_factor with expected_average_only_in

@pytest.mark.parametrize("where", ["cfg", "metadata"])
def test_saelens_expected_average_factor_is_folded(tmp_path: Path, model, where: str) -> None:
    from millm.sae.formats import load_sae

    w = weights(4)
    meta = {**V6, "norm_scaling_factor": 2.5} if where == "metadata" else V6
    extra = {"norm_scaling_factor": 2.5} if where == "cfg" else {}
    cfg = saelens_cfg(architecture="standard", apply_b_dec_to_input=True,
                      normalize_activations="expected_average_only_in", metadata=meta, **extra)
    loaded = load_sae(write_saelens_files(tmp_path / "s", w, cfg)).sae
    ref = SAELensRef(w, factor=2.5)
    check(loaded, ref.encode, ref.decode, model, inputs())


def test_saelens_expected_average_without_factor_loads_unscaled(tmp_path: Path, model) -> None:
    from millm.sae.formats import load_sae

    w = weights(4)
    cfg = saelens_cfg(architecture="standard", normalize_activations="expected_average_only_in", metadata=V6)
    ref = SAELensRef(w)  # as SAELens' load_from_disk: no factor, nothing applied
    check(load_sae(write_saelens_files(tmp_path / "s", w, cfg)).sae, ref.encode, ref.decode, model, inputs())


# 5 and 6. per-position normalisation: steering is un-normalised per position; layer-norm epsilon

@pytest.mark.parametrize("norm", ["constant_norm_rescale", "layer_norm"])
@pytest.mark.parametrize("arch", ["standard", "jumprelu"])
def test_saelens_per_position_normalisation(tmp_path: Path, model, norm: str, arch: str) -> None:
    import torch

    from millm.sae.formats import load_sae

    w = weights(5)
    threshold = torch.rand(D_SAE, generator=torch.Generator().manual_seed(9)) * 0.8 if arch == "jumprelu" else None
    cfg = saelens_cfg(architecture=arch, apply_b_dec_to_input=True, normalize_activations=norm, metadata=V6)
    loaded = load_sae(write_saelens_files(tmp_path / "s", saelens_tensors(w, threshold), cfg)).sae
    ref = SAELensRef(w, arch, threshold=threshold, norm=norm)
    check(loaded, ref.encode, ref.decode, model, inputs(offset=0.7))
    base, added = steering_added(model, loaded)
    fixed = STRENGTH * w["W_dec"][FEATURE]
    assert not torch.allclose(added, fixed.expand_as(added), atol=1e-2)  # not a fixed s * W_dec[i]
    scale = added.norm(dim=-1) / fixed.norm()
    assert scale.max() / scale.min() > 1.2  # the effect follows each token's norm (or std)


def test_saelens_layer_norm_epsilon_is_added_to_std(tmp_path: Path) -> None:
    import torch

    from millm.sae.formats import load_sae

    w = weights(6)
    cfg = saelens_cfg(architecture="standard", normalize_activations="layer_norm", metadata=V6)
    loaded = load_sae(write_saelens_files(tmp_path / "s", w, cfg)).sae
    x = inputs(spread=2e-5, offset=1.0)  # std about 3e-5: (x - mean) / (std + 1e-5), not / max(std, 1e-5)
    ref = SAELensRef(w, norm="layer_norm")
    close(loaded.encode(x), ref.encode(x))
    clamped = (x - x.mean(-1, keepdim=True)) / (x - x.mean(-1, keepdim=True)).std(-1, keepdim=True).clamp_min(1e-5)
    assert not torch.allclose(torch.relu((clamped - w["b_dec"]) @ w["W_enc"] + w["b_enc"]), ref.encode(x), atol=1e-2)


# 7. old-config defaults

def test_saelens_pre6_jumprelu_subtracts_b_dec_by_default(tmp_path: Path, model) -> None:
    import torch

    from millm.sae.formats import load_sae

    w, threshold = weights(7), torch.full((D_SAE,), 0.2)
    cfg = saelens_cfg(architecture="jumprelu", activation_fn_str="relu", hook_name="blocks.0.hook_resid_post")
    loaded = load_sae(write_saelens_files(tmp_path / "s", saelens_tensors(w, threshold), cfg)).sae
    assert loaded.apply_b_dec_to_input
    ref = SAELensRef(w, "jumprelu", threshold=threshold, apply_b_dec=True)
    check(loaded, ref.encode, ref.decode, model, inputs())


def test_saelens_v6_missing_apply_b_dec_means_true(tmp_path: Path) -> None:
    from millm.sae.formats import load_sae

    cfg = saelens_cfg(architecture="standard", metadata=V6)
    assert load_sae(write_saelens_files(tmp_path / "s", weights(), cfg)).sae.apply_b_dec_to_input


def test_saelens_pre6_boolean_normalize_activations(tmp_path: Path, model) -> None:
    from millm.sae.formats import load_sae

    w = weights(8)
    cfg = saelens_cfg(architecture="standard", normalize_activations=True, norm_scaling_factor=1.7)
    ref = SAELensRef(w, factor=1.7)  # true means expected_average_only_in
    check(load_sae(write_saelens_files(tmp_path / "a", w, cfg)).sae, ref.encode, ref.decode, model, inputs())
    cfg = saelens_cfg(architecture="standard", normalize_activations=False)
    ref = SAELensRef(w)
    check(load_sae(write_saelens_files(tmp_path / "b", w, cfg)).sae, ref.encode, ref.decode, model, inputs())


def test_saelens_v6_boolean_normalize_activations_refused(tmp_path: Path) -> None:
    from millm.sae.formats import load_sae

    cfg = saelens_cfg(architecture="standard", normalize_activations=True, metadata=V6)
    with pytest.raises(InvalidSAE, match=r"cfg.json: key 'normalize_activations' is True"):
        load_sae(write_saelens_files(tmp_path / "s", weights(), cfg))


# Llama Scope thresholds

@pytest.mark.parametrize("apply_b_dec", [False, True])
def test_llama_scope_threshold_is_in_raw_residual_units(tmp_path: Path, model, apply_b_dec: bool) -> None:
    """lm-saes applies jump_relu_threshold after folding the dataset-wise factor and the decoder norms into the
    weights, so the threshold gates pre_activation * ||W_dec[i]|| / factor (SAELens' converter multiplies it
    by the factor for its normalised-space pre-activations; the old miLLM compared it unscaled with those)."""
    import torch

    from millm.sae.formats import load_sae
    from millm.sae.model import SAE

    w = weights(10)
    norm_in, threshold = 0.5, 0.15  # factor sqrt(64) / 0.5 = 16
    sae = SAE(W_enc=w["W_enc"], b_enc=w["b_enc"], W_dec=w["W_dec"], b_dec=w["b_dec"], apply_b_dec_to_input=apply_b_dec)
    loaded = load_sae(write_llama_scope(tmp_path / "L3R", sae, threshold=threshold, norm_in=norm_in))
    assert loaded.format == "llama-scope" and loaded.layer_hint == 3
    x = inputs() * norm_in / 4  # residuals around the dataset's average norm
    encode, decode = lm_saes_ref(w, norm_in, threshold, apply_b_dec)
    check(loaded.sae, encode, decode, model, x)
    pre_norm = (x * 16 - (w["b_dec"] if apply_b_dec else 0)) @ w["W_enc"] + w["b_enc"]
    active = encode(x) > 0
    assert 0 < active.sum(-1).float().mean() < D_SAE / 2
    assert not torch.equal(pre_norm > threshold, active)  # the old reading: unscaled threshold, training space
    assert not torch.equal(pre_norm > threshold * 16, active)  # SAELens' reading, without the decoder norm


def test_llama_scope_refuses_transcoders_and_unknown_normalisation(tmp_path: Path) -> None:
    from millm.sae.formats import load_sae
    from millm.sae.model import SAE

    w = weights()
    sae = SAE(W_enc=w["W_enc"], b_enc=w["b_enc"], W_dec=w["W_dec"], b_dec=w["b_dec"])
    with pytest.raises(InvalidSAE, match=r"hyperparams.json: key 'hook_point_out'.*transcoder"):
        load_sae(write_llama_scope(tmp_path / "tc", sae, 0.1, norm_in=2.0,
                                   hook_point_out="blocks.3.hook_mlp_out"))
    with pytest.raises(InvalidSAE, match=r"hyperparams.json: key 'norm_activation' is 'token-wise'"):
        load_sae(write_llama_scope(tmp_path / "tw", sae, 0.1, norm_activation="token-wise"))


def test_llama_scope_log_threshold_tensor_is_in_training_space(tmp_path: Path) -> None:
    """A newer lm-saes checkpoint's ``log_jumprelu_threshold`` gates pre_activation * ||W_dec[i]|| in the
    training (dataset-wise) space: same active set and reconstruction as lm-saes' dataset-wise encode/decode."""
    import torch

    from millm.sae.formats import load_sae
    from millm.sae.model import SAE

    w, norm_in = weights(11), 0.5
    factor = D_IN ** 0.5 / norm_in
    threshold = 0.5 + torch.rand(D_SAE, generator=torch.Generator().manual_seed(12)) * 3
    sae = SAE(W_enc=w["W_enc"], b_enc=w["b_enc"], W_dec=w["W_dec"], b_dec=w["b_dec"], apply_b_dec_to_input=False)
    folder = write_llama_scope(tmp_path / "L3R", sae, threshold=0.0, norm_in=norm_in,
                               weights={"log_jumprelu_threshold": threshold.log()})
    loaded = load_sae(folder).sae
    x = inputs() * norm_in / 4
    pre = (x * factor) @ w["W_enc"] + w["b_enc"]
    acts = pre * (pre * w["W_dec"].norm(dim=-1) > threshold)  # lm-saes encode, dataset-wise mode
    recon = (acts @ w["W_dec"] + w["b_dec"]) / factor  # its decode, un-normalised
    got = loaded.encode(x)
    assert torch.equal(got > 0, acts > 0) and 0 < (acts > 0).sum(-1).float().mean() < D_SAE / 2
    close(loaded.decode(got), recon)
