"""Attaching is all or nothing: re-attaching an id with an SAE that cannot hold its values, or a failure
while the buffers are rewritten, leaves the previous attachment, its hook and its values as they were."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from millm.errors import InvalidFeatureIndex
from millm.steering.intensity import IntensitySettings
from millm.store import Store
from tests.steering.tiny import D, prompt_ids
from tests.support.saes import random_sae, write_saelens

if TYPE_CHECKING:
    import torch


def logits(model) -> torch.Tensor:
    import torch

    with torch.inference_mode():
        return model(prompt_ids()).logits


def test_a_smaller_sae_under_the_same_id_is_refused_before_anything_changes(model):
    import torch

    from millm.steering.controller import Steering

    steering = Steering(model)
    big = steering.attach("sae_a", random_sae(D, 128, seed=1), layer=2)
    steering.set_values("sae_a", {100: 8.0, 3: 2.0}, merge=False)
    steered = logits(model)
    with pytest.raises(InvalidFeatureIndex, match="100") as info:
        steering.attach("sae_a", random_sae(D, 64, seed=2), layer=2)
    assert info.value.status == 400
    assert steering.attachments["sae_a"] is big and big.sae.d_sae == 128 and big.values == {100: 8.0, 3: 2.0}
    assert len(model.model.layers[2]._forward_hooks) == 1
    assert torch.equal(logits(model), steered)  # the old hook still steers, with the old values


def test_a_failure_after_the_hook_swap_puts_the_old_attachment_back(model, monkeypatch):
    import torch

    from millm.steering.controller import Steering

    steering = Steering(model)
    old = steering.attach("sae_a", random_sae(D, 64, seed=1), layer=1)
    steering.set_values("sae_a", {3: 4.0}, merge=False)
    steered = logits(model)
    real = Steering._refresh
    calls = {"n": 0}

    def failing_once(self):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("out of memory while rewriting the buffers")
        return real(self)

    monkeypatch.setattr(Steering, "_refresh", failing_once)
    with pytest.raises(RuntimeError, match="out of memory"):
        steering.attach("sae_a", random_sae(D, 64, seed=2), layer=3)
    assert steering.attachments == {"sae_a": old} and old.layer == 1
    assert len(model.model.layers[1]._forward_hooks) == 1 and not model.model.layers[3]._forward_hooks
    assert torch.equal(logits(model), steered)


def test_the_service_reattaches_from_disk_all_or_nothing(model, tmp_path):
    """The SAE file registered under an id is replaced by a smaller one: attaching it again is refused and
    the live attachment, values and persisted state stay as they were."""
    from millm.steering.controller import Steering
    from millm.steering.monitor import Monitor
    from millm.steering.service import SteeringService
    from millm.steering.target import SteeringTarget

    service = SteeringService(Store(tmp_path / "millm.db"), IntensitySettings(2.0, 0.5, 0.0))
    folder = write_saelens(tmp_path / "sae", random_sae(D, 128, seed=1), layer=2)
    record = service.register_sae(folder)
    target = SteeringTarget("tiny", Steering(model), Monitor())
    service.attach(target, record["id"])
    service.set_values(target, record["id"], {"100": 8.0}, merge=False)
    persisted = service.store.get_state("steering:tiny")
    write_saelens(folder, random_sae(D, 64, seed=2), layer=2)
    with pytest.raises(InvalidFeatureIndex):
        service.attach(target, record["id"])
    att = target.steering.attachments[record["id"]]
    assert att.sae.d_sae == 128 and att.values == {100: 8.0}
    assert service.store.get_state("steering:tiny") == persisted
