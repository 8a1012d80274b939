"""Probes on the real model: learning (the stored figures reproduce from the stored split), verdicts while
decoding, and actions (abort, steer) per row, alone and under continuous batching."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import pytest

from millm.engine.events import Finish, Verdicts
from tests.probes.texts import NEGATIVE, POSITIVE
from tests.support.saes import attached_random
from tests.support.scheduler import alone, drain, plan, submit

if TYPE_CHECKING:
    from millm.probes.probe import Probe

LAYER = 14
PROMPT = "Write two sentences about rain and storms."
ACTING = "Describe a rainy afternoon in the city."  # its answer's score rises past the start's a few tokens in


@pytest.fixture(scope="module")
def probe(engine) -> Probe:
    from millm.probes.learn import learn
    from millm.vectors.learn import Examples

    return learn(engine, "rain-test", Examples(POSITIVE, NEGATIVE), LAYER, method="diffmean")


@pytest.fixture(scope="module")
def rolling(engine) -> Probe:
    from millm.probes.learn import learn
    from millm.vectors.learn import Examples

    return learn(engine, "rain-rolling", Examples(POSITIVE, NEGATIVE), LAYER, aggregation="rolling_mean", window=4)


def _run(engine, p):
    return list(engine.run(p))


def _verdicts(events) -> list[dict]:
    return next(e.body for e in events if isinstance(e, Verdicts))


@pytest.mark.parametrize("learned", ["probe", "rolling"])
def test_stored_figures_reproduce_from_the_stored_split(engine, learned, request):
    import torch

    from millm.probes.learn import aggregate, auroc, operating_point, read, score

    probe = request.getfixturevalue(learned)
    weight = torch.tensor(probe.weight)
    pos = aggregate(score(weight, probe.bias, read(engine, probe.held_out["positive"], LAYER)), probe.aggregation,
                    probe.window)
    neg = aggregate(score(weight, probe.bias, read(engine, probe.held_out["negative"], LAYER)), probe.aggregation,
                    probe.window)
    assert round(auroc(pos, neg), 6) == probe.figures.auroc
    threshold, recall, fpr = operating_point(pos, neg, probe.figures.target_fpr)
    assert (round(recall, 6), round(fpr, 6)) == (probe.figures.recall, probe.figures.fpr)
    # read in other batches (other padding), the scores agree to float32 rounding
    assert threshold == pytest.approx(probe.threshold, rel=1e-5)
    assert pos.tolist() == pytest.approx(probe.scores["positive"], rel=1e-5)
    assert probe.figures.auroc >= 0.9 and probe.figures.fpr <= probe.figures.target_fpr


def test_fires_on_the_concept_and_not_on_others(engine, probe):
    watched = (probe.watch(),)
    rain = replace(plan(engine, PROMPT, chat=True, max_tokens=24), probes=watched)
    other = replace(plan(engine, "Write two sentences about algebra and numbers.", chat=True, max_tokens=24),
                    probes=watched)
    [on_rain], [on_other] = _verdicts(_run(engine, rain)), _verdicts(_run(engine, other))
    assert on_rain["fired"] and on_rain["position"] is not None
    assert not on_other["fired"] and on_other["position"] is None
    assert on_rain["score"] > probe.threshold > on_other["score"]


def _threshold_mid_answer(engine, probe, p, at: int = 3) -> float:
    """A threshold that the answer's running max of this probe's score first reaches at response position ``at``
    or later (halfway between the max before and the first higher score after)."""
    import torch

    from millm.engine.params import Forced
    from millm.probes.learn import score

    events = _run(engine, p)
    ids = list(p.prompt_ids[0])
    answer = engine.tokenizer("".join(getattr(e, "text", "") for e in events), add_special_tokens=False)["input_ids"]
    spans = engine.residuals([Forced(tuple(ids + answer), len(ids))], LAYER, "all")
    scores = score(torch.tensor(probe.weight), probe.bias, [spans])[0].tolist()
    before = max(scores[:at])
    later = next(s for s in scores[at:] if s > before + 0.5)
    return (before + later) / 2


def test_abort_ends_the_row_at_the_firing_step_keeping_the_text_so_far(engine, probe):
    base = plan(engine, ACTING, chat=True, max_tokens=24)
    cut = _threshold_mid_answer(engine, probe, base)
    aborting = replace(base, probes=(replace(probe.watch("abort"), threshold=cut),))
    full = "".join(getattr(e, "text", "") for e in _run(engine, base))
    events = _run(engine, aborting)
    [verdict] = _verdicts(events)
    finish = next(e for e in events if isinstance(e, Finish))
    text = "".join(getattr(e, "text", "") for e in events)
    assert finish.reason == "content_filter" and verdict["acted"] and verdict["fired"]
    assert finish.completion_tokens == verdict["position"] + 1 >= 4  # the token fed at the firing step is the last
    assert full.startswith(text) and len(text) < len(full)
    assert not any(isinstance(e, Finish) for e in events[events.index(finish) + 1:])


def test_steer_changes_only_what_follows_the_firing_step(engine, probe):
    from millm.steering.core import RequestSteering

    with attached_random(engine, "sae_probe_steer", seed=5, layer=10) as sae:
        base = plan(engine, ACTING, chat=True, max_tokens=24)
        cut = _threshold_mid_answer(engine, probe, base)
        steer = RequestSteering("loud", {sae: {i: 60.0 for i in range(8)}})
        steering = replace(probe.watch("steer", "loud", steer), threshold=cut)
        plain_ids = _ids(engine, _run(engine, base))
        steered = _run(engine, replace(base, probes=(steering,)))
        [verdict] = _verdicts(steered)
        steered_ids = _ids(engine, steered)
    keep = verdict["position"] + 2  # the fed token that fired and the one sampled from that forward
    assert verdict["acted"] and steered_ids[:keep] == plain_ids[:keep]
    assert steered_ids[keep:] != plain_ids[keep:]


def _ids(engine, events) -> list[int]:
    text = "".join(getattr(e, "text", "") for e in events)
    return engine.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_an_acting_row_leaves_its_neighbours_text_alone_under_batching(engine, probe):
    from millm.engine.decode.admission import BatchSettings
    from millm.engine.decode.scheduler import Scheduler

    base = plan(engine, ACTING, chat=True, max_tokens=16)
    cut = _threshold_mid_answer(engine, probe, base)
    neighbours = [plan(engine, "The capital of France is", max_tokens=12),
                  replace(plan(engine, "Name three colours.", chat=True, max_tokens=12), probes=(probe.watch(),))]
    expected = [alone(engine, p) for p in neighbours]
    scheduler = Scheduler(engine, BatchSettings(max_rows=4, max_tokens=4 * 256, prefill_chunk=64))
    acting = submit(scheduler, replace(base, probes=(replace(probe.watch("abort"), threshold=cut),)))
    others = [submit(scheduler, p) for p in neighbours]
    drain(scheduler)
    assert acting.finishes == ["content_filter"]
    assert [(c.text, c.finishes) for c in others] == expected
    assert any(isinstance(e, Verdicts) for e in others[1].events)


def test_an_aborting_rolling_mean_ends_its_row_at_its_first_full_window_under_batching(engine, rolling):
    from millm.engine.decode.admission import BatchSettings
    from millm.engine.decode.scheduler import Scheduler

    neighbours = [plan(engine, "The capital of France is", max_tokens=10),
                  replace(plan(engine, "Name three colours.", chat=True, max_tokens=10), probes=(rolling.watch(),))]
    expected = [alone(engine, p) for p in neighbours]
    scheduler = Scheduler(engine, BatchSettings(max_rows=4, max_tokens=4 * 256, prefill_chunk=64))
    eager = replace(rolling.watch("abort"), threshold=-1e9)  # every full window reaches it
    acting = submit(scheduler, replace(plan(engine, ACTING, chat=True, max_tokens=16), probes=(eager,)))
    others = [submit(scheduler, p) for p in neighbours]
    drain(scheduler)
    [verdict] = _verdicts(acting.events)
    finish = next(e for e in acting.events if isinstance(e, Finish))
    assert acting.finishes == ["content_filter"] and verdict["acted"] and verdict["window"] == rolling.window
    assert verdict["position"] == rolling.window - 1 and finish.completion_tokens == rolling.window
    assert [(c.text, c.finishes) for c in others] == expected
