"""Steering a llama.cpp model through its control vectors (MILLM_GGUF_STEERING).

llama.cpp adds one vector per layer to that layer's output (``llama_set_adapter_cvec``): exactly where an
SAE's steering delta goes (resid_post of layer L). The rules are ``SteeringCore``'s, unchanged: the live
base, one row per generation with its request's own values or the base, operator wins. llama.cpp decodes one
sequence at a time here, so there is one row (slot 0); the engine binds it for each generation, uploads
``vector()`` before its first forward and again whenever the row changes (an operator change between two
tokens), and clears the control vector when the generation ends.

Layer indexing, pinned by tests/engine/test_gguf_steering.py against the transformers engine: llama.cpp's
layer ``il`` output is HF's ``resid_post`` of decoder layer ``il`` (0-based), its buffer starts at layer 1
(``data[(il - 1) * n_embd:]``), and layer 0's output has no control vector, so an SAE cannot attach there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from millm.errors import InvalidParameter
from millm.sae.model import SAE
from millm.steering.core import Attachment, SteeringCore

ROW = 0  # the one row: llama.cpp serves one generation at a time


@dataclass(frozen=True)
class ControlVector:
    """What to hand ``llama_set_adapter_cvec``: ``data`` (float32, ``n_embd`` per layer from layer 1) and the
    inclusive layer range it applies to. Equal vectors steer alike (the prompt cache's key)."""

    data: np.ndarray
    il_start: int
    il_end: int

    def key(self) -> tuple[int, int, bytes]:
        return self.il_start, self.il_end, self.data.tobytes()


class ControlVectorSteering(SteeringCore):
    """Attached SAEs and live steering values for a llama.cpp model of ``n_layers`` layers of width ``d_model``.

    The core's rules for every caller (the service, the management API, profiles, the per-request check),
    without hooks: its deltas leave through ``vector()``. Nothing reads the residual here, so monitoring
    and read-outs are refused (the engine's capabilities say it cannot read)."""

    def __init__(self, n_layers: int, d_model: int) -> None:
        super().__init__(n_layers, d_model, torch.device("cpu"), torch.float32)
        self.version = 0  # bumped whenever the row's deltas may have changed
        self.reserve_rows(1)

    def _install(self, att: Attachment) -> None:
        """Nothing to hook: the row's delta reaches llama.cpp through ``vector()``."""

    def _uninstall(self, att: Attachment) -> None:
        self.version += 1

    def _layer_device(self, layer: int) -> torch.device:
        return self.device  # the deltas are copied into llama.cpp's own buffer

    def _check_attach(self, sae_id: str, sae: SAE, layer: int) -> None:
        if not 1 <= layer < self.n_layers:
            below = (" llama.cpp's control vectors start at layer 1: layer 0's output cannot be steered."
                     if layer == 0 else "")
            raise InvalidParameter(f"'layer' must be between 1 and {self.n_layers - 1} on a GGUF model, got {layer}."
                                   + below, param="layer")
        if sae.per_position:
            raise InvalidParameter(f"SAE {sae_id} scales its steering by each position's residual norm "
                                   f"({sae.normalisation}); llama.cpp's control vector is one fixed vector "
                                   "per layer, so it cannot steer a GGUF model.", param="sae")

    def _write_row(self, att: Attachment, slot: int, delta: torch.Tensor | None) -> None:
        super()._write_row(att, slot, delta)
        self.version += 1

    def vector(self, slot: int = ROW) -> ControlVector | None:
        """The row's control vector: each steering attachment's delta at its layer (None: nothing steers)."""
        with self._lock:
            steering = [att for att in self.attachments.values() if att.rows is not None and slot in att.row_steering]
            if not steering:
                return None
            data = np.zeros((self.n_layers - 1) * self.d_model, dtype=np.float32)
            for att in steering:
                assert att.rows is not None
                start = (att.layer - 1) * self.d_model
                data[start:start + self.d_model] += att.rows[slot].detach().cpu().float().numpy()  # deltas add
            layers = [att.layer for att in steering]
            return ControlVector(data, min(layers), max(layers))
