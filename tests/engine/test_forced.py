"""Teacher-forced research reads (``Engine.forced``, the screen's estimate) on the bundled model: unsteered they
are the scoring path's own distribution; steered, each read is steered by its own override alone."""

from __future__ import annotations

import pytest

from millm.engine.params import Forced, TextPrompt
from tests.support.saes import random_sae

SAE_ID = "sae_forced"


@pytest.fixture
def attached(engine):
    engine.steering.attach(SAE_ID, random_sae(576, 64, seed=3), 10)
    try:
        yield engine
    finally:
        engine.steering.detach(SAE_ID)


def test_an_unsteered_read_is_the_scoring_paths_distribution(attached):
    import torch

    engine = attached
    ids = engine.tokenize(TextPrompt("The weather today is cold and wet, with rain"))
    start, watch = 4, tuple(engine.tokenize(TextPrompt(" rain", add_special_tokens=False)))
    [read] = engine.forced([Forced(tuple(ids), start, None, watch)])
    logits = engine.next_token_logits([ids[:i] for i in range(start, len(ids))], ["p"] * (len(ids) - start))
    want = logits.log_softmax(-1)[:, list(watch)].logsumexp(-1).exp()
    assert torch.allclose(torch.tensor(read), want, rtol=1e-3, atol=1e-7) and float(want.max()) > 1e-3


def test_each_read_is_steered_by_its_own_override_alone(attached):
    import torch

    from millm.steering.core import Override

    engine = attached
    engine.steering.set_values(SAE_ID, {5: 80.0}, merge=False)  # live values: they steer no read
    try:
        ids = tuple(engine.tokenize(TextPrompt("Tell me about the sea and the ships")))
        watch = tuple(range(100, 140))
        steer = Override("s", {SAE_ID: {7: 60.0}})
        alone_plain, alone_steered = engine.forced([Forced(ids, 3, None, watch)]), engine.forced(
            [Forced(ids, 3, steer, watch)])
        together = engine.forced([Forced(ids, 3, steer, watch), Forced(ids, 3, None, watch)])
    finally:
        engine.steering.clear()
    same = lambda a, b: torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-3, atol=1e-9)  # noqa: E731
    assert same(together[0], alone_steered[0]) and same(together[1], alone_plain[0])
    assert not torch.allclose(torch.tensor(alone_steered[0]), torch.tensor(alone_plain[0]), rtol=0.1, atol=0)
