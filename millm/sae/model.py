"""The SAE math: encode a residual into feature activations, decode features back.

Conventions follow SAELens: ``W_enc`` is ``[d_in, d_sae]``, ``W_dec`` is ``[d_sae, d_in]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

ARCHITECTURES = ("relu", "jumprelu", "topk")
NORMALISATIONS = ("none", "constant_scale", "constant_norm_rescale", "layer_norm")


@dataclass
class SAE:
    """One sparse autoencoder's weights and how to apply them.

    ``normalisation`` is applied to the input before encoding: ``constant_scale`` multiplies by
    ``scale`` (SAELens' expected-average norm factor, Llama Scope's dataset-wise norm),
    ``constant_norm_rescale`` rescales each position to norm sqrt(d_in), ``layer_norm`` standardises it.
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
    scale: float = 1.0
    meta: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"unknown SAE architecture {self.architecture!r}")
        if self.normalisation not in NORMALISATIONS:
            raise ValueError(f"unknown activation normalisation {self.normalisation!r}")

    @property
    def d_in(self) -> int:
        return self.W_enc.shape[0]

    @property
    def d_sae(self) -> int:
        return self.W_enc.shape[1]

    def to(self, device: torch.device | str, dtype: torch.dtype) -> SAE:
        """A copy on ``device`` in ``dtype`` (thresholds follow the weights)."""
        move = lambda t: None if t is None else t.to(device=device, dtype=dtype)  # noqa: E731
        return replace(self, W_enc=move(self.W_enc), b_enc=move(self.b_enc), W_dec=move(self.W_dec),
                       b_dec=move(self.b_dec), threshold=move(self.threshold))

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        if self.normalisation == "constant_scale":
            return x * self.scale
        if self.normalisation == "constant_norm_rescale":
            return x * (self.d_in ** 0.5) / x.norm(dim=-1, keepdim=True).clamp_min(1e-8)
        if self.normalisation == "layer_norm":
            mean = x.mean(dim=-1, keepdim=True)
            return (x - mean) / (x - mean).std(dim=-1, keepdim=True).clamp_min(1e-5)
        return x

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
        if self.architecture == "topk":
            acts = torch.relu(self.pre_activations(x))
            top = acts.topk(self.k or 1, dim=-1)
            acts = torch.zeros_like(acts).scatter(-1, top.indices, top.values)
            return acts if features is None else acts[..., features]
        pre = self.pre_activations(x, features)
        if self.architecture == "jumprelu":
            threshold = self.threshold if features is None else self.threshold[features]
            return torch.relu(pre) * (pre > threshold)
        return torch.relu(pre)

    def decode(self, acts: torch.Tensor) -> torch.Tensor:
        """Reconstruction in the normalised input space."""
        return acts @ self.W_dec + self.b_dec
