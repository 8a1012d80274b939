"""The held-out measure: the shipped prompt sets, the Wilson interval, and that only a strength whose held-out
interval reaches the target is stored as recommended."""

from __future__ import annotations

import json

import pytest

from millm.errors import InvalidParameter
from millm.research.interval import wilson
from millm.sae.measured import HeldOut, recommended_of


def point(strength, rate, fluency=-0.5):
    from millm.research.measure import FLUENCY_BOUND, Point

    return Point(strength, rate, -2.0 + fluency, fluency, fluency >= -FLUENCY_BOUND)


def test_wilson_interval_matches_a_hand_computed_case():
    # 8 of 16, z = 1.6449: centre (0.5 + z²/32) / (1 + z²/16) = 0.5; half z·sqrt(1/64 + z²/1024) / 1.1691 = 0.1902
    low, high = wilson(8, 16)
    assert low == pytest.approx(0.3098, abs=1e-4) and high == pytest.approx(0.6902, abs=1e-4)
    # 0 of 10: from 0 up to (z²/10) / (1 + z²/10) = 0.2706 / 1.2706
    assert wilson(0, 10) == (0.0, pytest.approx(0.21294, abs=1e-5))
    assert wilson(16, 16)[1] == 1.0 and wilson(16, 16)[0] == pytest.approx(0.85536, abs=1e-5)
    assert wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson(5, 4)


def test_the_shipped_prompt_sets_are_versioned_disjoint_and_at_least_16_each():
    from millm.research.measure import HELD_OUT_PROMPTS, NEUTRAL_PROMPTS
    from millm.research.prompt_sets import PROMPT_SET, prompt_set

    shipped = prompt_set()
    assert shipped.version == PROMPT_SET == "neutral-v1"
    lists = (shipped.calibration, shipped.held_out, shipped.fresh)
    assert all(len(prompts) >= 16 for prompts in lists)
    everything = [p for prompts in lists for p in prompts]
    assert len(set(everything)) == len(everything)  # no prompt in two lists
    assert NEUTRAL_PROMPTS == shipped.calibration and HELD_OUT_PROMPTS == shipped.held_out
    with pytest.raises(InvalidParameter, match="neutral-v1"):
        prompt_set("neutral-v0")


class Scripted:
    """A measure answering each strength with a fixed rate (``rates``), its prompts ``n`` of them."""

    def __init__(self, rates, n=16, fluency=-0.5):
        from millm.research.measure import FLUENCY_BOUND

        self.rates, self.fluency = rates, fluency
        self.prompts, self.seed, self.tokens, self.bound = tuple(f"p{i}" for i in range(n)), 0, 24, FLUENCY_BOUND
        self.plain, self.plain_logprob = ["nothing"] * n, -2.0
        self.weights = "float32+int8"

    def points(self, cases):
        return [point(c.strength, self.rates.get(c.strength, 0.0) if c.values else 0.0, self.fluency)
                for c in cases]


def sweep(calibration, held):
    from millm.research.sweep import run_sweep

    return run_sweep(calibration, held, "sae", 10, 3, "rain", ("rain",), (20, 40, 60))


def test_calibration_passes_and_held_out_fails_so_nothing_recommended_is_stored(tmp_path):
    from millm.research.saving import Measured, save_measured
    from millm.sae.cards import read_card

    # 40 reaches 60% on the calibration prompts; on the held-out prompts it mentions the concept 3 times in 16
    result = sweep(Scripted({20: 0.25, 40: 0.625, 60: 0.75}), Scripted({40: 3 / 16}))
    assert result.chosen == 40 and result.recommended is None
    held = result.held_out
    assert held is not None and held.rate == 3 / 16 and held.calibration_rate == 0.625
    assert (held.low, held.high) == wilson(3, 16) and held.high < 0.6
    (tmp_path / "features.jsonl").write_text(json.dumps({"index": 3, "label": "rain", "recommended_strength": 40,
                                                         "concept_rate": 0.75}) + "\n")
    save_measured(tmp_path, {3: Measured(held)})
    row = json.loads((tmp_path / "features.jsonl").read_text())
    assert "recommended_strength" not in row and "concept_rate" not in row  # the old measure is gone
    assert row["held_out"]["rate"] == 0.1875 and row["held_out"]["recommended"] is False
    card = read_card(tmp_path, 3, 64, name="t")
    assert card.measured and card.recommended_strength is None and card.concept_rate == 0.1875


def test_a_held_out_interval_reaching_the_target_is_stored_as_recommended(tmp_path):
    from millm.research.saving import Measured, save_measured
    from millm.sae.cards import read_card

    result = sweep(Scripted({20: 0.25, 40: 0.625}), Scripted({40: 7 / 16}))  # 44%: its interval reaches 60%
    assert result.recommended == 40 and result.held_out is not None and result.held_out.high >= 0.6
    (tmp_path / "features.jsonl").write_text("")
    save_measured(tmp_path, {3: Measured(result.held_out, "rain")})
    row = json.loads((tmp_path / "features.jsonl").read_text())
    assert row["recommended_strength"] == 40 and row["held_out"]["interval"] == [round(x, 4) for x in wilson(7, 16)]
    card = read_card(tmp_path, 3, 64, name="t")
    assert card.recommended_strength == 40 and card.to_json()["held_out"]["prompt_set"] == "neutral-v1"
    # the calibration sweep that chose 40 is kept beside it, point for point, and drawn as a sweep job's figure
    swept = [(p.strength, p.rate) for p in result.points]
    assert [(p["strength"], p["rate"]) for p in row["held_out"]["sweep"]] == swept and (40, 0.625) in swept
    assert card.held_out is not None and [(s, r) for s, r, _, _ in card.held_out.sweep] == swept


def test_a_measure_records_the_weights_its_answers_came_from_and_says_them(tmp_path):
    from millm.research.saving import Measured, save_measured
    from millm.sae.cards import read_card

    result = sweep(Scripted({20: 0.25, 40: 0.625}), Scripted({40: 7 / 16}))
    assert result.held_out is not None and result.held_out.weights == "float32+int8"
    (tmp_path / "features.jsonl").write_text("")
    save_measured(tmp_path, {3: Measured(result.held_out, "rain")})
    assert json.loads((tmp_path / "features.jsonl").read_text())["held_out"]["weights"] == "float32+int8"
    card = read_card(tmp_path, 3, 64, name="t")
    assert card.held_out is not None and card.held_out.weights == "float32+int8"
    assert card.held_out.describe().endswith("at 40 (neutral-v1, float32+int8 weights)")
    older = {k: v for k, v in result.held_out.to_json().items() if k != "weights"}  # stored before it was recorded
    assert HeldOut.from_json(older).weights == "" and HeldOut.from_json(older).describe().endswith("(neutral-v1)")


def test_a_stored_sweep_draws_as_a_sweep_jobs_figure_marked_at_the_chosen_strength():
    from millm.research.figures import sweep_figure

    result = sweep(Scripted({20: 0.25, 40: 0.625}), Scripted({40: 7 / 16}))
    held = result.held_out
    assert held is not None
    body = held.to_json()
    drawn = sweep_figure({"points": body["sweep"], "target": held.target, "bound": held.bound,
                          "chosen_strength": held.strength})
    assert drawn["xs"] == [p.strength for p in result.points] and drawn["mark"]["x"] == 40
    assert drawn["panels"][0]["series"][0]["values"] == [p.rate for p in result.points]


def test_held_out_fluency_past_the_bound_is_not_recommended():
    result = sweep(Scripted({40: 0.625}), Scripted({40: 1.0}, fluency=-2.0))
    assert result.held_out is not None and result.held_out.high == 1.0 and result.recommended is None


def test_a_calibration_that_chooses_nothing_verifies_nothing():
    assert sweep(Scripted({}), Scripted({40: 1.0})).held_out is None


def test_an_older_single_set_strength_is_not_read_as_recommended():
    assert recommended_of({"index": 1, "recommended_strength": 40, "concept_rate": 0.9}) is None
    held = HeldOut("neutral-v1", 40.0, 0.7, 0.5, 0.3, 0.69, 16, 24, 0, -0.4, -0.1, 0.0)
    assert recommended_of({"recommended_strength": 40, "held_out": held.to_json()}) == 40.0
    assert HeldOut.from_json(json.loads(json.dumps(held.to_json()))) == held
    assert "held-out 50% [30%-69%] of 16 answers at 40" in held.describe()


def test_drop_older_leaves_held_out_measures_alone(tmp_path):
    from millm.research.saving import drop_older

    held = HeldOut("neutral-v1", 40.0, 0.7, 0.5, 0.3, 0.69, 16, 24, 0, -0.4, -0.1, 0.0).to_json()
    rows = [{"index": 1, "label": "a", "recommended_strength": 40, "concept_rate": 0.5},
            {"index": 2, "label": "b", "held_out": held, "recommended_strength": 40}, {"index": 3, "label": "c"}]
    (tmp_path / "features.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert drop_older(tmp_path) == 1
    saved = [json.loads(line) for line in (tmp_path / "features.jsonl").read_text().splitlines()]
    assert saved == [{"index": 1, "label": "a"}, rows[1], rows[2]]


def test_a_screen_verifies_each_chosen_strength_on_the_held_out_prompts():
    from millm.research.screen import screen

    class Measured(Scripted):
        engine = None

        def points(self, cases):
            self.asked = [*getattr(self, "asked", []), [(dict(c.values), c.strength) for c in cases]]
            return super().points(cases)

    calibration = Measured({20: 0.25, 40: 0.625, 60: 0.75, 80: 0.75})
    held = Measured({40: 3 / 16})
    found = screen(calibration, held, "sae", {3: "rain", 5: "snow", 8: "12"}, estimated={3: 0.5, 5: 0.1},
                   strengths=(20, 40, 60, 80))
    assert [s.feature for s in found.swept] == [3]  # 5 is under the floor, 8 has no concept words
    [swept] = found.swept
    assert held.asked == [[({"sae": {3: 40}}, 40)]]  # only the chosen strength, on the held-out prompts
    assert swept.held_out.rate == 3 / 16 and swept.recommended is None and found.steers == []


def test_the_remeasured_bundled_strengths_load_from_the_shipped_files():
    from millm.sae.bundled import bundled_saes
    from millm.sae.cards import feature_rows, held_out_measures, measured_features, read_card

    bundled = {b.id: b for b in bundled_saes()}
    l10 = bundled["smollm2-135m-res-L10"]
    music = held_out_measures(l10.path)[2375]  # re-measured: bench/remeasure.py --features 2375
    assert music.prompt_set == "neutral-v1" and music.answers == 16 and music.strength is not None
    card = read_card(l10.path, 2375, 4096, name=l10.id)
    assert card.held_out == music and card.recommended_strength == music.recommended_strength
    for b in bundled.values():  # a recommended strength is read from a held-out measure alone
        rows = feature_rows(b.path)
        measures = held_out_measures(b.path).values()  # every bundled SAE re-measured, on the CPU's float32
        assert any(h.recommended for h in measures) and {h.weights for h in measures} == {"float32"}
        assert not any("concept_rate" in r or ("recommended_strength" in r and "held_out" not in r)
                       for r in rows.values())  # no older single-set measure kept beside them
        assert set(measured_features(b.path)) == {i for i, h in held_out_measures(b.path).items() if h.recommended}
        assert all(rows[i].get("recommended_strength") == h.strength for i, h in held_out_measures(b.path).items()
                   if h.recommended)
