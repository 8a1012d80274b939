"""The intensity dial, sentence by sentence of the spec's "Intensity coupling" (pure: no model, no HTTP)."""

from __future__ import annotations

import math
import re

import pytest

from millm.config import Settings
from millm.errors import InvalidParameter
from millm.sfv import sf_string
from millm.steering.intensity import (
    Base,
    BaseKind,
    Context,
    IntensitySettings,
    Symbol,
    check_stored_dial,
    format_lambda,
    parse_intensity,
    resolve,
)
from millm.steering.rung import RUNGS, rung_header, rung_language
from millm.steering.values import STRENGTH_LIMIT

CLUSTER, CIRCUIT, SLICE, PLAIN = BaseKind.CLUSTER, BaseKind.CIRCUIT, BaseKind.SLICE_FALLBACK, BaseKind.PLAIN

DEFAULT = IntensitySettings(intensity_max=2.0, cluster_min=0.5, circuit_min=0.0)
LOW_MAX = IntensitySettings(intensity_max=1.5, cluster_min=0.5, circuit_min=0.0)
CIRCUIT_FLOOR = IntensitySettings(intensity_max=2.0, cluster_min=0.5, circuit_min=0.3)

# Authored strengths on two SAEs (a circuit spans layers); the strong member reaches the +-200 ceiling first.
AUTHORED = {"sae_a": {1: 10.0, 2: -150.0}, "sae_b": {7: 120.0}}
DIALED = Context(dial_only=False, steering_enabled=True, sae_attached=True, base_empty=False)


def scaled(lam: float) -> dict[str, dict[int, float]]:
    """What each member should be at ``lam``, written out independently of the resolver."""
    return {sae: {f: max(-STRENGTH_LIMIT, min(STRENGTH_LIMIT, s * lam)) for f, s in v.items()}
            for sae, v in AUTHORED.items()} if lam else {}


def flat(strengths: dict[str, dict[int, float]]) -> dict[tuple[str, int], float]:
    return {(sae, f): s for sae, v in strengths.items() for f, s in v.items()}


# (why, base kind, declared range, stored dial, settings, request value, expected λ, echo)
ROWS = [
    # clusters
    ("cluster: no steering_intensity, the persistent dial applies", CLUSTER, None, 0.8, DEFAULT, None, 0.8, None),
    ("cluster: the request's λ overrides the stored one", CLUSTER, None, 0.8, DEFAULT, 1.2, 1.2, "1.2"),
    ("cluster: min is the declared range's floor", CLUSTER, (0.3, 1.5), 1.0, DEFAULT, "min", 0.3, "0.3"),
    ("cluster: max is the declared range's ceiling", CLUSTER, (0.3, 1.5), 1.0, DEFAULT, "max", 1.5, "1.5"),
    ("cluster: a declared range is intersected with [0, 2] (max)", CLUSTER, (0.2, 2.5), 1.0, DEFAULT, "max", 2.0,
     "2.0"),
    ("cluster: a declared range is intersected with [0, 2] (min)", CLUSTER, (-0.5, 1.0), 1.0, DEFAULT, "min", 0.0,
     "0.0"),
    ("cluster: numeric λ is capped at the range's maximum", CLUSTER, (0.3, 1.5), 1.0, DEFAULT, 1.8, 1.5, "1.5"),
    ("cluster: a declared range wins over MILLM_INTENSITY_MAX", CLUSTER, (0.3, 1.8), 1.0, LOW_MAX, 1.8, 1.8, "1.8"),
    ("cluster: no declared range, capped at MILLM_INTENSITY_MAX", CLUSTER, None, 1.0, LOW_MAX, 1.8, 1.5, "1.5"),
    ("cluster: no declared range, max is MILLM_INTENSITY_MAX", CLUSTER, None, 1.0, LOW_MAX, "max", 1.5, "1.5"),
    ("cluster: no declared range, max defaults to 2.0", CLUSTER, None, 1.0, DEFAULT, "max", 2.0, "2.0"),
    ("cluster: no declared range, min is CLUSTER_INTENSITY_MIN 0.5", CLUSTER, None, 1.0, DEFAULT, "min", 0.5,
     "0.5"),
    ("cluster: below the declared floor is honoured", CLUSTER, (0.5, 1.5), 1.0, DEFAULT, 0.1, 0.1, "0.1"),
    ("cluster: below CLUSTER_INTENSITY_MIN is honoured", CLUSTER, None, 1.0, DEFAULT, 0.2, 0.2, "0.2"),
    ("cluster: a stored dial above a lowered maximum is capped", CLUSTER, None, 1.8, LOW_MAX, None, 1.5, None),
    ("cluster: a stored dial of 0 steers nothing", CLUSTER, None, 0.0, DEFAULT, None, 0.0, None),
    ("cluster: 0 turns steering off", CLUSTER, (0.5, 1.5), 1.0, DEFAULT, 0, 0.0, "0.0"),
    ("cluster: 'off' turns steering off", CLUSTER, (0.5, 1.5), 1.0, DEFAULT, "off", 0.0, "0.0"),
    # circuits serving natively
    ("circuit: 0.1 against [0.5, 1.5] resolves to 0.5", CIRCUIT, (0.5, 1.5), 1.0, DEFAULT, 0.1, 0.5, "0.5"),
    ("circuit: the ceiling is clamped too", CIRCUIT, (0.5, 1.5), 1.0, DEFAULT, 1.8, 1.5, "1.5"),
    ("circuit: inside the range λ is as asked", CIRCUIT, (0.5, 1.5), 1.0, DEFAULT, 0.7, 0.7, "0.7"),
    ("circuit: an exact 0 goes below the floor", CIRCUIT, (0.5, 1.5), 1.0, DEFAULT, 0, 0.0, "0.0"),
    ("circuit: 'off' goes below the floor", CIRCUIT, (0.5, 1.5), 1.0, DEFAULT, "off", 0.0, "0.0"),
    ("circuit: min is the declared floor", CIRCUIT, (0.5, 1.5), 1.0, DEFAULT, "min", 0.5, "0.5"),
    ("circuit: max is the declared ceiling", CIRCUIT, (0.5, 1.5), 1.0, DEFAULT, "max", 1.5, "1.5"),
    ("circuit: no declared range, min equals off (floor 0)", CIRCUIT, None, 1.0, DEFAULT, "min", 0.0, "0.0"),
    ("circuit: no declared range, a small λ is honoured", CIRCUIT, None, 1.0, DEFAULT, 0.01, 0.01, "0.01"),
    ("circuit: CIRCUIT_INTENSITY_MIN is the floor without a range", CIRCUIT, None, 1.0, CIRCUIT_FLOOR, "min", 0.3,
     "0.3"),
    ("circuit: and λ below it is raised to it", CIRCUIT, None, 1.0, CIRCUIT_FLOOR, 0.1, 0.3, "0.3"),
    ("circuit: no declared range, max is MILLM_INTENSITY_MAX", CIRCUIT, None, 1.0, LOW_MAX, "max", 1.5, "1.5"),
    ("circuit: no declared range, λ clamped at MILLM_INTENSITY_MAX", CIRCUIT, None, 1.0, LOW_MAX, 1.8, 1.5, "1.5"),
    ("circuit: absolute, not compounding on its stored intensity", CIRCUIT, None, 0.5, DEFAULT, 1.0, 1.0, "1.0"),
    ("circuit: at 2 the strong members reach +-200, weak ones scale", CIRCUIT, None, 1.0, DEFAULT, 2, 2.0, "2.0"),
    ("circuit: without a dial, the authored strengths", CIRCUIT, (0.5, 1.5), 1.0, DEFAULT, None, 1.0, None),
    # circuits in slice_fallback: the backing cluster's rule
    ("slice_fallback: min is the cluster floor 0.5", SLICE, None, 1.0, DEFAULT, "min", 0.5, "0.5"),
    ("slice_fallback: below the floor is honoured", SLICE, (0.5, 1.5), 1.0, DEFAULT, 0.1, 0.1, "0.1"),
    ("slice_fallback: capped at the cluster's ceiling", SLICE, (0.5, 1.5), 1.0, DEFAULT, 1.8, 1.5, "1.5"),
    ("slice_fallback: the cluster's stored dial applies", SLICE, None, 0.6, DEFAULT, None, 0.6, None),
    ("slice_fallback: off", SLICE, None, 1.0, DEFAULT, "off", 0.0, "0.0"),
    # a plain profile or the live values scale like a cluster without a declared range
    ("plain: without a dial, the strengths as they are", PLAIN, None, 1.0, LOW_MAX, None, 1.0, None),
    ("plain: min is CLUSTER_INTENSITY_MIN", PLAIN, None, 1.0, DEFAULT, "min", 0.5, "0.5"),
    ("plain: max is MILLM_INTENSITY_MAX", PLAIN, None, 1.0, DEFAULT, "max", 2.0, "2.0"),
    ("plain: capped at MILLM_INTENSITY_MAX", PLAIN, None, 1.0, LOW_MAX, 1.8, 1.5, "1.5"),
    ("plain: below the floor is honoured", PLAIN, None, 1.0, DEFAULT, 0.2, 0.2, "0.2"),
    ("plain: 0 is off", PLAIN, None, 1.0, DEFAULT, 0.0, 0.0, "0.0"),
]


@pytest.mark.parametrize("why,kind,declared,stored,settings,value,lam,echo", ROWS, ids=[r[0] for r in ROWS])
def test_intensity_coupling(why, kind, declared, stored, settings, value, lam, echo):
    base = Base(kind, AUTHORED, declared, stored)
    out = resolve(parse_intensity(value), DIALED, lambda: base, settings)
    assert out.applies
    assert out.lam == pytest.approx(lam)
    assert out.off == (lam == 0.0)
    assert flat(out.strengths) == pytest.approx(flat(scaled(lam)))
    assert out.strengths.keys() == scaled(lam).keys()
    assert out.echo == echo


def test_members_clamp_at_the_steering_limit_and_keep_their_order_below_it():
    out = resolve(2.0, DIALED, lambda: Base(CIRCUIT, AUTHORED), DEFAULT)
    assert out.strengths == {"sae_a": {1: 20.0, 2: -STRENGTH_LIMIT}, "sae_b": {7: STRENGTH_LIMIT}}


def test_each_resolution_starts_from_the_authored_strengths():
    base = Base(CIRCUIT, AUTHORED)
    resolve(2.0, DIALED, lambda: base, DEFAULT)
    again = resolve(0.5, DIALED, lambda: base, DEFAULT)
    assert again.strengths == {"sae_a": {1: 5.0, 2: -75.0}, "sae_b": {7: 60.0}}
    assert base.strengths == AUTHORED


@pytest.mark.parametrize("value", [0, 0.0, "off"])
def test_off_never_looks_at_the_base(value):
    def broken_base() -> Base:
        raise InvalidParameter("this profile would 400 at λ=0.01", param="profile")

    out = resolve(parse_intensity(value), DIALED, broken_base, DEFAULT)
    assert (out.applies, out.lam, out.strengths, out.echo) == (True, 0.0, {}, "0.0")
    with pytest.raises(InvalidParameter):
        resolve(parse_intensity(0.01), DIALED, broken_base, DEFAULT)


# (why, context, request value, applies, echo) -- the echo is omitted whenever the dial will not change steering
ECHO_ROWS = [
    ("dial-only request, steering on", Context(True, True, True, False), 1.5, True, "1.5"),
    ("profile named, steering on", Context(False, True, True, False), 1.5, True, "1.5"),
    ("profile named while steering is disabled still steers", Context(False, False, True, False), 1.5, True, "1.5"),
    ("steering disabled with a dial-only request", Context(True, False, True, False), 1.5, False, None),
    ("steering disabled with a dial-only 'off'", Context(True, False, True, False), "off", False, None),
    ("no SAE attached", Context(False, True, False, False), 1.5, False, None),
    ("no SAE attached, 'off'", Context(False, True, False, False), "off", False, None),
    ("an empty steering base", Context(True, True, True, True), 1.5, False, None),
    ("an empty steering base, 'max'", Context(False, True, True, True), "max", False, None),
]


@pytest.mark.parametrize("why,context,value,applies,echo", ECHO_ROWS, ids=[r[0] for r in ECHO_ROWS])
def test_echo_only_when_the_dial_changes_steering(why, context, value, applies, echo):
    out = resolve(parse_intensity(value), context, lambda: Base(CLUSTER, AUTHORED), DEFAULT)
    assert (out.applies, out.echo) == (applies, echo)
    if not applies:
        assert out.lam is None and out.strengths == {}


def test_a_base_that_resolves_to_nothing_is_not_dialled():
    out = resolve(1.5, DIALED, lambda: Base(PLAIN, {"sae_a": {}}), DEFAULT)
    assert (out.applies, out.lam, out.echo) == (False, None, None)


@pytest.mark.parametrize("value", [-0.1, -1, 2.0001, 3, float("nan"), float("inf"), True, False, "1", "0.5", "",
                                   "Off", "MAX", "none", "half", [1], {"lambda": 1}])
def test_invalid_values_are_400_naming_steering_intensity(value):
    with pytest.raises(InvalidParameter) as exc:
        parse_intensity(value)
    assert (exc.value.status, exc.value.code, exc.value.param) == (400, "invalid_parameter", "steering_intensity")
    assert "steering_intensity" in exc.value.message


@pytest.mark.parametrize("value,parsed", [(None, None), (0, Symbol.OFF), (0.0, Symbol.OFF), ("off", Symbol.OFF),
                                          ("min", Symbol.MIN), ("max", Symbol.MAX), (1, 1.0), (2, 2.0),
                                          (0.25, 0.25)])
def test_valid_values(value, parsed):
    assert parse_intensity(value) == parsed


@pytest.mark.parametrize("lam,text", [(0.0, "0.0"), (1, "1.0"), (0.5, "0.5"), (2.0, "2.0"), (1 / 3, "0.333"),
                                      (0.01, "0.01"), (1.25, "1.25")])
def test_the_echo_is_an_rfc8941_decimal(lam, text):
    assert format_lambda(lam) == text
    assert re.fullmatch(r"-?\d{1,12}\.\d{1,3}", text)


@pytest.mark.parametrize("declared,settings,good,bad", [
    (None, DEFAULT, [0, 0.0, 0.3, 2.0], [-0.1, 2.01, True, "1", math.nan]),
    (None, LOW_MAX, [0, 1.5], [1.6]),
    ((0.5, 1.2), DEFAULT, [0, 0.1, 1.2], [1.3, 2.0]),
])
def test_the_stored_dial_is_bounded_to_zero_and_the_maximum(declared, settings, good, bad):
    for value in good:
        assert check_stored_dial(value, declared, settings) == value
    for value in bad:
        with pytest.raises(InvalidParameter) as exc:
            check_stored_dial(value, declared, settings)
        assert exc.value.param == "lambda"


def test_settings_defaults_and_environment(monkeypatch):
    for var in ("MILLM_INTENSITY_MAX", "MILLM_CLUSTER_INTENSITY_MIN", "MILLM_CIRCUIT_INTENSITY_MIN"):
        monkeypatch.delenv(var, raising=False)
    assert IntensitySettings.from_settings(Settings()) == DEFAULT
    monkeypatch.setenv("MILLM_INTENSITY_MAX", "1.5")
    monkeypatch.setenv("MILLM_CIRCUIT_INTENSITY_MIN", "0.3")
    assert IntensitySettings.from_settings(Settings()) == IntensitySettings(1.5, 0.5, 0.3)


@pytest.mark.parametrize("env", [{"MILLM_INTENSITY_MAX": "2.5"}, {"MILLM_INTENSITY_MAX": "0"},
                                 {"MILLM_CLUSTER_INTENSITY_MIN": "-0.1"},
                                 {"MILLM_INTENSITY_MAX": "1.0", "MILLM_CLUSTER_INTENSITY_MIN": "1.2"},
                                 {"MILLM_INTENSITY_MAX": "1.0", "MILLM_CIRCUIT_INTENSITY_MIN": "1.5"}])
def test_settings_outside_the_envelope_are_refused(monkeypatch, env):
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match="intensity"):
        Settings()


SPEC_LADDER = {0: "associated", 1: "suggested (attribution-supported)", 2: "causally validated (edge)",
               3: "faithfulness-tested (circuit)"}


def test_the_rung_header_is_the_spec_ladder_in_rfc8941_form():
    assert rung_header(2) == '2; language="causally validated (edge)"'
    for rung in RUNGS:
        assert rung_language(rung) == SPEC_LADDER[rung]
        # sf-item: an sf-integer with one parameter whose value is an sf-string
        match = re.fullmatch(r'(\d+); language="((?:[ !#-\[\]-~]|\\["\\])*)"', rung_header(rung))
        assert match and int(match[1]) == rung and match[2] == SPEC_LADDER[rung]
    assert list(RUNGS) == [0, 1, 2, 3]


@pytest.mark.parametrize("rung", [-1, 4, True])
def test_no_phrase_outside_the_ladder(rung):
    with pytest.raises(ValueError):
        rung_header(rung)


def test_sf_string_escapes_what_would_break_a_parser():
    assert sf_string('a "b" \\ c') == '"a \\"b\\" \\\\ c"'
    assert sf_string("λ 100%") == '"%CE%BB 100%25"'
