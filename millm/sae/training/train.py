"""Training a TopK sparse autoencoder on residual-stream activations.

What the field has learnt works (Gao et al. 2024, "Scaling and evaluating sparse autoencoders"):
- TopK activation: exactly ``k`` latents fire per token, so sparsity needs no L1 penalty to tune;
- decoder rows kept at unit norm (the gradient's component along each row is removed before the
  step and the rows are renormalised after it), so a steering strength means the same for every feature;
- the encoder starts as the decoder's transpose, ``b_dec`` starts at the data mean;
- an auxiliary loss (AuxK) makes the top ``aux_k`` dead latents reconstruct the main reconstruction's
  error, which revives them;
- Adam with a linear warm-up and a linear decay to zero, gradients clipped to norm 1.

Inputs are scaled internally so that their mean norm is sqrt(d_in) (hyperparameters then do not
depend on the model's activation scale); :meth:`TopKTrainer.export` folds that scale back out so the
saved SAE reads raw activations, keeps unit-norm decoder rows, and selects the same top-k latents.
The reported loss is the batch's fraction of variance unexplained (FVU).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from millm.sae.model import SAE

CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True)
class TrainConfig:
    """Hyperparameters of one training run (everything a resume must agree on)."""

    d_in: int
    d_sae: int
    k: int = 32
    steps: int = 1000
    batch_size: int = 4096
    lr: float = 0.0  # 0: the paper's scaling, 2e-4 / sqrt(d_sae / 2**14), times 4 for short runs
    warmup_fraction: float = 0.05
    decay_fraction: float = 0.2  # the last 20% of steps decay linearly to zero
    aux_k: int = 0  # 0: d_in // 2, the paper's heuristic
    aux_coef: float = 1 / 32
    dead_tokens: int = 0  # 0: a tenth of the run's tokens, at most 10M (the paper's window)
    grad_clip: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("d_in", "d_sae", "k", "steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"'{name}' must be at least 1, got {getattr(self, name)}.")
        if self.k > self.d_sae:
            raise ValueError(f"'k' ({self.k}) cannot exceed the width d_sae ({self.d_sae}).")

    @property
    def learning_rate(self) -> float:
        return self.lr or 4 * 2e-4 / math.sqrt(self.d_sae / 2**14)

    @property
    def auxiliary_k(self) -> int:
        return min(self.aux_k or self.d_in // 2, self.d_sae)

    @property
    def dead_window(self) -> int:
        """Tokens a latent may go without firing before it counts as dead."""
        return self.dead_tokens or max(self.batch_size, min(10_000_000, self.steps * self.batch_size // 10))

    def lr_at(self, step: int) -> float:
        """Linear warm-up, flat, then linear decay to zero over the last ``decay_fraction`` of steps."""
        warmup = max(1, round(self.steps * self.warmup_fraction))
        decay_start = self.steps - round(self.steps * self.decay_fraction)
        scale = min(1.0, (step + 1) / warmup)
        if step >= decay_start:
            scale = min(scale, (self.steps - step) / max(1, self.steps - decay_start))
        return self.learning_rate * scale


@dataclass
class StepStats:
    """What one optimisation step reports (all plain floats)."""

    loss: float  # what is minimised: fvu + aux_coef * aux_loss
    fvu: float  # fraction of the batch's variance unexplained, before this step's update
    aux_loss: float
    l0: float
    dead_fraction: float
    lr: float


def topk_encode(x: torch.Tensor, W_enc: torch.Tensor, b_enc: torch.Tensor, b_dec: torch.Tensor,
                k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pre-activations, top-k values after ReLU, their indices) for inputs ``x`` ``[B, d_in]``."""
    pre = (x - b_dec) @ W_enc + b_enc
    top = pre.topk(k, dim=-1, sorted=False)
    return pre, F.relu(top.values), top.indices


def sparse_decode(values: torch.Tensor, indices: torch.Tensor, W_dec: torch.Tensor) -> torch.Tensor:
    """``sum_j values[:, j] * W_dec[indices[:, j]]`` without building the dense ``[B, d_sae]`` code."""
    return F.embedding_bag(indices, W_dec, per_sample_weights=values, mode="sum")


def auxk_error_fit(pre: torch.Tensor, dead: torch.Tensor, error: torch.Tensor, W_dec: torch.Tensor,
                   aux_k: int) -> torch.Tensor:
    """The AuxK loss: how badly the top ``aux_k`` dead latents reconstruct ``error``, normalised by the
    error's variance and scaled down while few latents are dead (0 when none is)."""
    n_dead = int(dead.sum())
    if n_dead == 0:
        return pre.new_zeros(())
    k = min(aux_k, n_dead)
    masked = pre.masked_fill(~dead, float("-inf"))
    top = masked.topk(k, dim=-1, sorted=False)
    fit = sparse_decode(F.relu(top.values), top.indices, W_dec)
    variance = (error - error.mean(0)).pow(2).sum().clamp_min(1e-12)
    return min(n_dead / aux_k, 1.0) * (fit - error).pow(2).sum() / variance


def fraction_unexplained(x: torch.Tensor, recon: torch.Tensor) -> torch.Tensor:
    """FVU: residual sum of squares over total sum of squares around the batch mean."""
    return (x - recon).pow(2).sum() / (x - x.mean(0)).pow(2).sum().clamp_min(1e-12)


class TopKTrainer:
    """Parameters, optimiser and dead-latent bookkeeping of one TopK SAE being trained."""

    def __init__(self, config: TrainConfig, data_mean: torch.Tensor, scale: float) -> None:
        """``data_mean`` is the raw activations' mean; ``scale`` multiplies raw inputs (see module doc)."""
        if data_mean.shape != (config.d_in,):
            raise ValueError(f"data_mean has shape {tuple(data_mean.shape)}, expected ({config.d_in},).")
        self.config = config
        self.scale = float(scale)
        g = torch.Generator().manual_seed(config.seed)
        W_dec = torch.randn(config.d_sae, config.d_in, generator=g)
        W_dec /= W_dec.norm(dim=-1, keepdim=True)
        self.W_dec = W_dec.requires_grad_()
        self.W_enc = W_dec.detach().T.clone().contiguous().requires_grad_()
        self.b_enc = torch.zeros(config.d_sae, requires_grad=True)
        self.b_dec = (data_mean.float() * self.scale).clone().requires_grad_()
        self.optimizer = torch.optim.Adam(self.parameters(), lr=config.learning_rate, eps=6.25e-10)
        self.tokens_since_fired = torch.zeros(config.d_sae, dtype=torch.long)
        self.step_index = 0

    def parameters(self) -> list[torch.Tensor]:
        return [self.W_enc, self.b_enc, self.W_dec, self.b_dec]

    @property
    def dead(self) -> torch.Tensor:
        return self.tokens_since_fired >= self.config.dead_window

    def step(self, raw: torch.Tensor) -> StepStats:
        """One Adam step on a batch of raw activations ``[B, d_in]``."""
        cfg = self.config
        x = raw.float() * self.scale
        lr = cfg.lr_at(self.step_index)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        pre, values, indices = topk_encode(x, self.W_enc, self.b_enc, self.b_dec, cfg.k)
        recon = sparse_decode(values, indices, self.W_dec) + self.b_dec
        loss = fraction_unexplained(x, recon)
        dead = self.dead
        aux = auxk_error_fit(pre, dead, (x - recon).detach(), self.W_dec, cfg.auxiliary_k)
        self.optimizer.zero_grad(set_to_none=True)
        (loss + cfg.aux_coef * aux).backward()
        with torch.no_grad():
            grad = self.W_dec.grad
            if grad is not None:  # keep the update tangent to the unit sphere of each row
                grad -= (grad * self.W_dec).sum(-1, keepdim=True) * self.W_dec
            torch.nn.utils.clip_grad_norm_(self.parameters(), cfg.grad_clip)
            self.optimizer.step()
            self.W_dec /= self.W_dec.norm(dim=-1, keepdim=True).clamp_min(1e-8)
            fired = torch.zeros(cfg.d_sae, dtype=torch.bool)
            fired[indices[values > 0]] = True
            self.tokens_since_fired += x.shape[0]
            self.tokens_since_fired[fired] = 0
        self.step_index += 1
        fvu, aux_value = float(loss.detach()), float(aux.detach())
        return StepStats(loss=fvu + cfg.aux_coef * aux_value, fvu=fvu, aux_loss=aux_value,
                         l0=float((values > 0).sum(-1).float().mean()), dead_fraction=float(dead.float().mean()), lr=lr)

    def export(self) -> SAE:
        """The trained SAE on raw activations (scale folded out; decoder rows stay unit norm)."""
        with torch.no_grad():
            return SAE(W_enc=self.W_enc.detach().clone(), b_enc=self.b_enc.detach() / self.scale,
                       W_dec=self.W_dec.detach().clone(), b_dec=self.b_dec.detach() / self.scale,
                       architecture="topk", k=self.config.k, apply_b_dec_to_input=True)

    # checkpoints
    def state(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "scale": self.scale, "step": self.step_index,
                "params": [p.detach() for p in self.parameters()], "optimizer": self.optimizer.state_dict(),
                "tokens_since_fired": self.tokens_since_fired}

    def save_checkpoint(self, folder: Path, extra: dict[str, Any] | None = None) -> None:
        """Write the checkpoint atomically (a kill mid-write leaves the previous one readable)."""
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / (CHECKPOINT + ".tmp")
        torch.save({**self.state(), "extra": extra or {}}, tmp)
        os.replace(tmp, folder / CHECKPOINT)

    @classmethod
    def from_checkpoint(cls, path: Path) -> tuple[TopKTrainer, dict[str, Any]]:
        """The trainer as checkpointed, and the checkpoint's ``extra`` dict."""
        state = torch.load(path, weights_only=True)
        config = TrainConfig(**state["config"])
        trainer = cls(config, state["params"][3] / state["scale"], state["scale"])
        with torch.no_grad():
            for p, saved in zip(trainer.parameters(), state["params"]):
                p.copy_(saved)
        trainer.optimizer.load_state_dict(state["optimizer"])
        trainer.tokens_since_fired = state["tokens_since_fired"]
        trainer.step_index = state["step"]
        return trainer, state.get("extra", {})


class ShuffledBatches:
    """Batches drawn from an activation buffer ``[N, d_in]`` in a fresh seeded permutation each epoch.

    Batch ``i`` depends only on ``(seed, i)``, so a resumed run reads exactly the batches it would have.
    """

    def __init__(self, buffer: torch.Tensor, batch_size: int, seed: int) -> None:
        if buffer.shape[0] < batch_size:
            raise ValueError(f"The activation buffer holds {buffer.shape[0]} tokens, fewer than one batch "
                             f"({batch_size}); collect more tokens or lower the batch size.")
        self.buffer, self.batch_size, self.seed = buffer, batch_size, seed
        self.per_epoch = buffer.shape[0] // batch_size
        self._epoch, self._order = -1, torch.empty(0, dtype=torch.long)

    def batch(self, index: int) -> torch.Tensor:
        epoch, within = divmod(index, self.per_epoch)
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._epoch, self._order = epoch, torch.randperm(self.buffer.shape[0], generator=g)
        rows = self._order[within * self.batch_size:(within + 1) * self.batch_size]
        return self.buffer[rows].float()


def train(trainer: TopKTrainer, batches: ShuffledBatches, *, checkpoint_dir: Path | None = None,
          checkpoint_every: int = 200, on_step: Callable[[StepStats], None] | None = None) -> None:
    """Run the remaining steps, checkpointing every ``checkpoint_every`` steps and at the end."""
    while trainer.step_index < trainer.config.steps:
        stats = trainer.step(batches.batch(trainer.step_index))
        if on_step is not None:
            on_step(stats)
        done = trainer.step_index == trainer.config.steps
        if checkpoint_dir is not None and (done or trainer.step_index % checkpoint_every == 0):
            trainer.save_checkpoint(checkpoint_dir)
