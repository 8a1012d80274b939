"""The SAE math: encode a residual into feature activations, decode features back, un-normalise a direction.

Conventions follow SAELens: ``W_enc`` is ``[d_in, d_sae]``, ``W_dec`` is ``[d_sae, d_in]``. Whatever a
format does with a constant factor (an expected-average norm, a dataset-wise norm, decoder row norms) is
folded into the weights once at load time (``fold_input_scale``, ``fold_decoder_norms``), so only the
per-position normalisations, which depend on each token's residual, remain at run time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

ARCHITECTURES = ("relu", "jumprelu", "topk", "groupmax", "linear")  # linear: a steering vector set
NORMALISATIONS = ("none", "constant_norm_rescale", "layer_norm")
LAYER_NORM_EPS = 1e-5  # SAELens' run_time_activation_ln_in: (x - mean) / (std + 1e-5)


@dataclass
class SAE:
    """One sparse autoencoder's weights and how to apply them.

    ``normalisation`` is SAELens' per-position input normalisation, undone on the way out:
    ``constant_norm_rescale`` scales each position to norm sqrt(d_in) and back, ``layer_norm``
    standardises it (unbiased std, as ``torch.std``) and restores its mean and std. ``topk`` keeps the
    ``k`` largest ReLU'd pre-activations; ``groupmax`` (EleutherAI sparsify) splits the features into
    ``k`` contiguous groups and keeps the largest ReLU'd pre-activation of each.
    """

    W_enc: torch.Tensor
    b_enc: torch.Tensor
    W_dec: torch.Tensor
    b_dec: torch.Tensor
    architecture: str = "relu"
    threshold: torch.Tensor | None = None
    k: int | None = None
    apply_b_dec_to_input: bool = True
    normalisation: str = "none"
    meta: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problem = self._unknown_kind() or self._missing_parameter()
        if problem is not None:
            raise ValueError(problem)

    def _unknown_kind(self) -> str | None:
        """What is wrong with the architecture or normalisation named, when either is not one miLLM runs."""
        if self.architecture not in ARCHITECTURES:
            return f"unknown SAE architecture {self.architecture!r}"
        if self.normalisation not in NORMALISATIONS:
            return f"unknown activation normalisation {self.normalisation!r}"
        return None

    def _missing_parameter(self) -> str | None:
        """What the architecture needs and lacks: jumprelu a threshold; topk and groupmax a positive k; groupmax a
        width k divides."""
        if self.architecture == "jumprelu" and self.threshold is None:
            return "a jumprelu SAE needs a threshold"
        if self.architecture in ("topk", "groupmax") and (self.k is None or self.k < 1):
            return f"a {self.architecture} SAE needs a positive k"
        if self.architecture == "groupmax" and self.d_sae % (self.k or 1):
            return f"groupmax needs d_sae ({self.d_sae}) divisible by k ({self.k})"
        return None

    @property
    def d_in(self) -> int:
        return self.W_enc.shape[0]

    @property
    def d_sae(self) -> int:
        return self.W_enc.shape[1]

    @property
    def per_position(self) -> bool:
        """Whether the normalisation depends on each position's residual (so decoding needs that residual)."""
        return self.normalisation != "none"

    def to(self, device: torch.device | str, dtype: torch.dtype) -> SAE:
        """A copy on ``device`` in ``dtype`` (thresholds follow the weights)."""
        move = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
        return replace(self, W_enc=move(self.W_enc), b_enc=move(self.b_enc), W_dec=move(self.W_dec),
                       b_dec=move(self.b_dec), threshold=None if self.threshold is None else move(self.threshold))

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        """The input as the encoder sees it (SAELens' run_time_activation_norm_fn_in)."""
        if self.normalisation == "constant_norm_rescale":
            return x * (self.d_in ** 0.5) / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        if self.normalisation == "layer_norm":
            centred = x - x.mean(dim=-1, keepdim=True)
            return centred / (centred.std(dim=-1, keepdim=True) + LAYER_NORM_EPS)
        return x

    def output_scale(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., 1]``: how much a direction in the SAE's output space is scaled at the position whose residual
        is ``x`` (SAELens' run_time_activation_norm_fn_out divides by the input's norm coefficient, or
        multiplies by its std); computed in float32 and returned in ``x``'s dtype."""
        wide = x.float()
        if self.normalisation == "constant_norm_rescale":
            scale = wide.norm(dim=-1, keepdim=True) / (self.d_in ** 0.5)
        elif self.normalisation == "layer_norm":
            scale = wide.std(dim=-1, keepdim=True)
        else:
            scale = torch.ones_like(wide[..., :1])
        return scale.to(x.dtype)

    def pre_activations(self, x: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        """Encoder pre-activations, for every feature or only ``features`` (cheaper when few)."""
        x = self.normalise(x.to(self.W_enc.dtype))
        if self.apply_b_dec_to_input:
            x = x - self.b_dec
        if features is None:
            return x @ self.W_enc + self.b_enc
        return x @ self.W_enc[:, features] + self.b_enc[features]

    def encode(self, x: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        """Feature activations ``[..., d_sae]`` (or ``[..., len(features)]``)."""
        if self.architecture in ("topk", "groupmax"):
            acts = self._select(torch.relu(self.pre_activations(x)))
            return acts if features is None else acts[..., features]
        pre = self.pre_activations(x, features)
        if self.architecture == "linear":  # a vector set's reading: the signed projection on each vector
            return pre
        if self.architecture == "jumprelu":
            assert self.threshold is not None
            threshold = self.threshold if features is None else self.threshold[features]
            return torch.relu(pre) * (pre > threshold)
        return torch.relu(pre)

    def _select(self, acts: torch.Tensor) -> torch.Tensor:
        """Keep the top ``k`` (topk) or each group's largest (groupmax) of non-negative ``acts``."""
        k = self.k or 1
        if self.architecture == "topk":
            top = acts.topk(k, dim=-1)
            return torch.zeros_like(acts).scatter(-1, top.indices, top.values)
        groups = acts.unflatten(-1, (k, -1))
        best = groups.max(dim=-1, keepdim=True)
        return torch.zeros_like(groups).scatter(-1, best.indices, best.values).flatten(-2)

    def decode(self, acts: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        """Reconstruction in the input's space; with a per-position normalisation, ``x`` is the input that
        ``acts`` were encoded from (its norm, or mean and std, are restored as SAELens does)."""
        out = acts @ self.W_dec + self.b_dec
        if not self.per_position:
            return out
        if x is None:
            raise ValueError(f"decoding an SAE with {self.normalisation} needs the input it was encoded from")
        out = out * self.output_scale(x.to(out.dtype))
        if self.normalisation == "layer_norm":
            out = out + x.to(out.dtype).mean(dim=-1, keepdim=True)
        return out


def fold_input_scale(sae: SAE, factor: float) -> SAE:
    """The same SAE reading ``x`` where it was trained on ``factor * x``.

    SAELens' ``fold_activation_norm_scaling_factor``: ``W_enc * factor``, ``W_dec / factor``,
    ``b_dec / factor``. Pre-activations, thresholds and activations are unchanged; decoding (and so a
    feature's steering direction) comes out in the unscaled space.
    """
    return replace(sae, W_enc=sae.W_enc * factor, W_dec=sae.W_dec / factor, b_dec=sae.b_dec / factor)


def fold_decoder_norms(sae: SAE) -> SAE:
    """The same SAE with unit decoder rows, for formats that gate on ``pre_activation * ||W_dec[i]||``.

    SAELens' TopK ``rescale_acts_by_decoder_norm`` (its ``_fold_norm_topk``) and lm-saes'
    ``sparsity_include_decoder_norm`` (its ``transform_to_unit_decoder_norm``): encoder columns and
    ``b_enc`` are multiplied by the row norms and the rows divided by them, so top-k and thresholds
    (which these formats already apply to the scaled value) see the same numbers and the
    reconstruction is unchanged.
    """
    norms = sae.W_dec.norm(dim=-1).clamp_min(1e-8)
    return replace(sae, W_enc=sae.W_enc * norms, b_enc=sae.b_enc * norms, W_dec=sae.W_dec / norms[:, None])
