"""Teacher-forced research reads (``Engine.forced``, the screen's estimate) on the bundled model: unsteered they
are the scoring path's own distribution; steered, each read is steered by its own values alone."""

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

    from millm.steering.core import RequestSteering

    engine = attached
    engine.steering.set_values(SAE_ID, {5: 80.0}, merge=False)  # live values: they steer no read
    try:
        ids = tuple(engine.tokenize(TextPrompt("Tell me about the sea and the ships")))
        watch = tuple(range(100, 140))
        steer = RequestSteering("s", {SAE_ID: {7: 60.0}})
        alone_plain, alone_steered = engine.forced([Forced(ids, 3, None, watch)]), engine.forced(
            [Forced(ids, 3, steer, watch)])
        together = engine.forced([Forced(ids, 3, steer, watch), Forced(ids, 3, None, watch)])
    finally:
        engine.steering.clear()
    same = lambda a, b: torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-3, atol=1e-9)  # noqa: E731
    assert same(together[0], alone_steered[0]) and same(together[1], alone_plain[0])
    assert not torch.allclose(torch.tensor(alone_steered[0]), torch.tensor(alone_plain[0]), rtol=0.1, atol=0)


def test_same_forward_groups_unsteered_reads_of_the_same_tokens():
    from millm.engine.scoring import same_forward
    from millm.steering.core import RequestSteering

    steer = RequestSteering("s", {SAE_ID: {7: 60.0}})
    reads = [Forced((1, 2, 3), 1, None, (5,)), Forced((1, 2, 3), 1, None, (6,)), Forced((1, 2, 3), 2, None, (5,)),
             Forced((1, 2, 3), 1, steer, (5,)), Forced((1, 2, 4), 1, None), Forced((1, 2, 3), 1, steer, (6,)),
             Forced((1, 2, 3), 1, None)]
    assert same_forward(reads) == [[0, 1, 6], [2], [3], [4], [5]]


def test_unsteered_reads_of_the_same_tokens_each_get_their_own_words(attached):
    """The screen reads the same answers unsteered for every feature's words: one forward serves them all, and
    each read still gets its own words' chances."""
    import torch

    from millm.steering.core import RequestSteering

    engine = attached
    ids = tuple(engine.tokenize(TextPrompt("The weather today is cold and wet, with rain and snow")))
    watches = [tuple(engine.tokenize(TextPrompt(w, add_special_tokens=False))) for w in (" rain", " snow", " cold")]
    steer = RequestSteering("s", {SAE_ID: {7: 60.0}})
    together = engine.forced([Forced(ids, 4, None, w) for w in watches] + [Forced(ids, 4, steer, watches[0])])
    alone = [engine.forced([Forced(ids, 4, None, w)])[0] for w in watches]
    same = lambda a, b: torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-3, atol=1e-9)  # noqa: E731
    assert all(same(t, a) for t, a in zip(together, alone))
    assert not same(together[0], together[1]) and not same(together[3], together[0])
