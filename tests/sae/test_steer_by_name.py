"""``--steer NAME`` without a strength: the recommended strength (its held-out measure's), said; a clear refusal
with the best held-out point where none is recommended."""

from __future__ import annotations

import pytest

from millm.errors import InvalidParameter
from millm.sae.measured import HeldOut

LABELS = {3: "rain, storm", 7: "weather, sky", 9: "music, melody", 11: "dog, puppy"}


def held(strength, rate, high):
    return HeldOut("neutral-v1", strength, 0.75, rate, 0.2, high, 16, 24, 0, -0.4, -0.1, 0.0)


def index():
    from millm.sae.labels import LabelIndex  # torch: imported when a test runs, not at collection

    return LabelIndex(LABELS, "test-sae", {7: held(60.0, 0.5, 0.69), 9: held(40.0, 0.125, 0.3),
                                           11: HeldOut("neutral-v1", None)})


def test_a_name_alone_takes_its_recommended_strength_and_says_so():
    said: list[str] = []
    assert index().resolve_assignments(["weather", "3=-20", "#7"], said=said.append) == {7: 60.0, 3: -20.0}
    assert said[0] == ("weather: feature 7 of test-sae at its recommended strength 60 "
                       "(held-out 50% [20%-69%] of 16 answers at 60 (neutral-v1))")
    assert len(said) == 2 and said[1].startswith("#7: feature 7")


def test_no_recommended_strength_is_refused_with_the_best_held_out_point():
    with pytest.raises(InvalidParameter) as exc:
        index().resolve_assignments(["music"])
    message = exc.value.message
    assert "'music' (feature 9 of test-sae) has no recommended strength" in message
    assert "held-out 12% [20%-30%] of 16 answers at 40" in message and "music=STRENGTH" in message
    assert exc.value.param == "steer"
    with pytest.raises(InvalidParameter, match="never measured on held-out prompts"):
        index().resolve_assignments(["rain"])
    with pytest.raises(InvalidParameter, match="no strength mentions the concept"):
        index().resolve_assignments(["dog"])
