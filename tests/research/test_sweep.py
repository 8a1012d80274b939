"""Pure parts of ``millm.research``: concept matching, the recommendation rule, the PNG writer, --save."""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import asdict

import pytest

from millm.errors import InvalidParameter
from millm.research.saving import Measured, save_measured
from millm.research.words import concept_rate, label_words, mentions, word_forms
from millm.sae.measured import HeldOut


def point(strength, rate, fluency):
    from millm.research.measure import FLUENCY_BOUND, Point

    return Point(strength, rate, -2.0 + fluency, fluency, fluency >= -FLUENCY_BOUND)


def test_label_words_are_the_label_terms_that_are_words():
    assert label_words("rain, Storm, weather") == ("rain", "storm", "weather")
    assert label_words("paris, rome, ctrl") == ("paris", "rome", "ctrl")
    assert label_words("\\n, 's, to, music") == ("music",)  # escapes, fragments and 2-letter terms are not words
    assert label_words("") == ()


def test_mentions_whole_words_and_plurals_any_case():
    assert mentions("The Rain fell.", ("rain",))
    assert mentions("two dogs and three foxes", ("dog",)) and mentions("foxes", ("fox",))
    assert not mentions("the rainbow and the drain", ("rain",))
    assert not mentions("anything", ())


def test_mentions_count_a_plural_terms_singular_and_a_words_other_plurals():
    assert mentions("My dog barked.", ("dogs",)) and mentions("big cities", ("city",))
    assert mentions("one city", ("cities",)) and mentions("a box", ("boxes",))
    assert not mentions("a gla", ("glass",)) and not mentions("the bu", ("bus",))  # not plurals to strip
    assert word_forms("glass") == ("glass", "glasss", "glasses")
    assert mentions("a movie", ("movies",)) and mentions("a cookie", ("cookies",))
    assert not mentions("a new day", ("news",)) and not mentions("the one", ("ones",))  # not their plurals


def test_concept_rate_is_the_share_of_answers_that_mention_a_word():
    answers = ["I love music.", "A quiet day.", "Melody and song", "Musical chairs"]
    assert concept_rate(answers, ("music", "melody")) == 0.5
    assert concept_rate([], ("music",)) == 0.0


def test_recommend_lowest_strength_reaching_the_target_inside_the_bound():
    from millm.research.sweep import recommend

    table = [point(0, 0.0, 0.0), point(20, 0.3, -0.2), point(40, 0.6, -0.8), point(60, 0.9, -1.2),
             point(80, 1.0, -1.9)]
    assert recommend(table) == 40
    assert recommend(list(reversed(table))) == 40  # order of the table does not matter


def test_recommend_skips_strengths_past_the_fluency_bound():
    from millm.research.sweep import recommend

    table = [point(0, 0.0, 0.0), point(20, 0.7, -1.6), point(40, 0.8, -1.4)]
    assert recommend(table) == 40
    assert recommend(table, bound=1.3) is None  # 40 falls outside a tighter bound too, and 20 already was


def test_recommend_falls_back_to_the_highest_rate_inside_the_bound():
    from millm.research.sweep import recommend

    table = [point(0, 0.1, 0.0), point(20, 0.2, -0.3), point(40, 0.5, -1.0), point(60, 0.5, -1.1),
             point(80, 0.95, -2.5)]
    assert recommend(table) == 40  # the lower of two equal rates


def test_recommend_none_when_nothing_mentions_the_concept_inside_the_bound():
    from millm.research.sweep import recommend

    assert recommend([point(0, 0.7, 0.0), point(20, 0.0, -0.5), point(40, 0.9, -2.0)]) is None
    assert recommend([point(0, 0.8, 0.0)]) is None  # strength 0 steers nothing: never recommended
    assert recommend([]) is None


def test_recommend_orders_negative_strengths_by_size():
    from millm.research.sweep import recommend

    assert recommend([point(-60, 0.7, -0.5), point(-20, 0.65, -0.4)]) == -20


def test_refine_halves_the_gap_at_the_fluency_crossing_when_nothing_inside_reaches_the_target():
    from millm.research.sweep import refine

    table = [point(0, 0.0, 0.0), point(20, 0.2, -0.3), point(40, 0.45, -1.0), point(60, 0.75, -1.9),
             point(80, 0.9, -2.6)]
    assert refine(table) == 50
    assert refine(list(reversed(table))) == 50
    assert refine([point(-40, 0.4, -1.0), point(-60, 0.8, -1.8)]) == -50  # negative sweeps by size


def test_refine_asks_nothing_when_the_target_is_reached_or_there_is_no_crossing():
    from millm.research.sweep import refine

    assert refine([point(40, 0.6, -1.0), point(60, 0.9, -1.9)]) is None  # 40 already reaches the target
    assert refine([point(20, 0.1, -0.2), point(40, 0.3, -0.5)]) is None  # nothing past the bound
    assert refine([point(20, 0.7, -1.6), point(40, 0.8, -1.9)]) is None  # nothing inside the bound
    assert refine([point(40, 0.4, -1.0), point(48, 0.8, -1.8)]) is None  # too close to tell apart
    assert refine([point(-40, 0.4, -1.0), point(60, 0.8, -1.8)]) is None  # no crossing on one side
    assert refine([point(20, 0.0, -0.5), point(40, 0.0, -1.0), point(60, 0.0, -1.8)]) is None  # never mentioned


def test_refine_finds_the_crossing_on_each_side_of_zero():
    # the negative side stays fluent at -80; the positive side crosses the bound between 40 and 60
    from millm.research.sweep import refine

    table = [point(-80, 0.1, -0.9), point(-40, 0.0, -0.4), point(40, 0.3, -1.0), point(60, 0.9, -1.8),
             point(80, 0.9, -2.5)]
    assert refine(table) == 50
    assert refine([point(-40, 0.3, -1.0), point(-60, 0.9, -1.8), point(40, 0.0, -0.2)]) == -50


class ScriptedMeasure:
    """Rate and fluency as straight lines in the strength: a "steers" case mentions its concept 1% and loses
    0.035 nats per unit; any other mentions nothing and loses 0.01 per unit."""

    def __init__(self):
        from millm.research.measure import FLUENCY_BOUND

        self.bound = FLUENCY_BOUND
        self.asked = []

    def points(self, cases):
        self.asked.append([c.strength for c in cases])
        return [point(c.strength, c.strength / 100, -0.035 * c.strength) if c.words == ("steers",)
                else point(c.strength, 0.0, -0.01 * c.strength) for c in cases]


def test_swept_points_adds_strengths_at_the_crossing_in_rounds_sampled_together():
    from millm.research.measure import Case
    from millm.research.sweep import recommend, swept_points

    measure = ScriptedMeasure()
    out = swept_points(measure, [lambda s: Case(s, {}, ("steers",)), lambda s: Case(s, {}, ("flat",))], (20, 40, 60))
    # 40 (inside, 40%) and 60 (past -1.5): 50 is measured, past the bound too (-1.75), so then 45
    assert measure.asked == [[20, 40, 60, 20, 40, 60], [50.0], [45.0]]
    assert [p.strength for p in out[0]] == [20, 40, 45, 50, 60]
    # the second sweep never crossed the bound (and never mentioned its concept): its grid alone
    assert recommend(out[0]) == 40 and out[1] == [point(s, 0.0, -0.01 * s) for s in (20, 40, 60)]


class UnsteeredLast(ScriptedMeasure):
    """A scripted measure that notes when its unsteered answers are read (a real one samples them alone when
    they are asked for before any case)."""

    prompts, tokens, seed, plain_logprob = ("a", "b"), 8, 0, -2.0

    @property
    def plain(self):
        self.asked.append("plain")
        return ["rain again", "sun"]


def test_a_sweep_reads_the_unsteered_answers_after_its_cases_so_they_ride_in_the_first_job():
    from millm.research.sweep import run_sweep

    measure = UnsteeredLast()
    result = run_sweep(measure, measure, "sae", 10, 3, "rain", ("rain",), (20, 40))
    assert measure.asked[0] == [20, 40] and "plain" in measure.asked[1:]
    assert result.unsteered_rate == 0.5 and result.unsteered_logprob == -2.0 and len(result.points) == 2


def test_parse_strengths():
    from millm.research.sweep import parse_strengths

    assert parse_strengths("0,20, 40") == [0.0, 20.0, 40.0]
    for bad in ("", "a,b", "0,0", "0,300"):
        with pytest.raises(InvalidParameter):
            parse_strengths(bad)


def chunks(data):
    at, found = 8, []
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length:at + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF
        found.append((kind, body))
        at += 12 + length
    return found


def test_png_writer_writes_a_valid_png(tmp_path):
    from millm.research.plots import png_bytes

    pixels = [[(255, 0, 0), (0, 255, 0), (0, 0, 255)], [(0, 0, 0), (255, 255, 255), (1, 2, 3)]]
    data = png_bytes(pixels)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    found = chunks(data)
    assert [k for k, _ in found] == [b"IHDR", b"IDAT", b"IEND"]
    width, height, depth, colour, _, _, _ = struct.unpack(">IIBBBBB", found[0][1])
    assert (width, height, depth, colour) == (3, 2, 8, 2)
    raw = zlib.decompress(found[1][1])
    rows = [bytes([255, 0, 0, 0, 255, 0, 0, 0, 255]), bytes([0, 0, 0, 255, 255, 255, 1, 2, 3])]
    assert raw == b"".join(b"\x00" + row for row in rows)  # filter type 0, then the row's RGB bytes


def test_a_sweeps_figure_drawn_as_a_png_in_both_themes(tmp_path):
    from millm.research.figures import THEMES, sweep_figure
    from millm.research.plots import LEFT, PANEL, RIGHT, TOP, WIDTH, figure_pixels, write_figure

    points = [point(0, 0.0, 0.0), point(40, 0.5, -0.5), point(80, 1.0, -2.0)]
    result = {"points": [asdict(p) for p in points], "target": 0.6, "bound": 1.5, "chosen_strength": 40.0}
    figure = sweep_figure(result)
    assert figure["xs"] == [0, 40, 80] and figure["mark"] == {"x": 40.0, "label": "chosen 40"}
    assert [s["values"] for s in figure["panels"][0]["series"]] == [[0.0, 0.5, 1.0]]
    data = write_figure(tmp_path / "plot.png", figure).read_bytes()
    width, height = struct.unpack(">II", chunks(data)[0][1][:8])
    assert (width, height) == (WIDTH, TOP + 2 * (PANEL + 34) + 8)
    for theme, colours in THEMES.items():
        img = figure_pixels(figure, theme)
        assert img[0][0] == colours["background"]
        right = WIDTH - RIGHT
        assert img[TOP][right] == colours["s1"]  # the concept rate's last point, 100%, at the panel's top right
        assert img[TOP + PANEL][LEFT] == colours["s1"]  # its first, 0%, at the bottom left
        target = round(TOP + PANEL - 0.6 * PANEL)
        assert img[target][LEFT + 1] == colours["ref-target"]  # the target rate's dashed line
    assert figure_pixels(figure, "dark") != figure_pixels(figure, "light")


def test_bar_lines_one_per_strength():
    from millm.research.plots import bar_lines

    lines = bar_lines([point(0, 0.0, 0.0), point(40, 0.5, -0.5), point(80, 1.0, -2.0)], width=10)
    assert len(lines) == 3 and lines[1].startswith("40 │█████     │  50%")
    assert "inside" in lines[1] and "past -1.5" in lines[2]


def held(strength, rate):
    return HeldOut("neutral-v1", strength, 0.75, rate, 0.3, 0.7 if rate >= 0.4 else 0.5, 16, 24, 0, -0.4, 0.0, 0.0)


def test_save_measured_writes_the_keys_into_the_rows_at_once(tmp_path):
    rows = [{"index": 3, "label": "rain, storm"}, {"index": 7, "label": "dog, dogs", "top_tokens": [["dog", 1.0]]}]
    (tmp_path / "features.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    save_measured(tmp_path, {7: Measured(held(40.0, 0.5))})
    saved = [json.loads(line) for line in (tmp_path / "features.jsonl").read_text().splitlines()]
    assert saved[0] == rows[0]
    assert saved[1] == {**rows[1], "recommended_strength": 40.0, "held_out": held(40.0, 0.5).to_json()}
    # a feature without a row gets one; one with a row is measured again
    save_measured(tmp_path, {9: Measured(held(60.0, 0.5), "cat"), 7: Measured(held(20.0, 1.0))})
    saved = [json.loads(line) for line in (tmp_path / "features.jsonl").read_text().splitlines()]
    assert saved[1]["recommended_strength"] == 20.0 and saved[1]["held_out"]["rate"] == 1.0
    assert saved[2] == {"index": 9, "label": "cat", "held_out": held(60.0, 0.5).to_json(), "recommended_strength": 60.0}
    assert not list(tmp_path.glob(".features-*"))  # written by one atomic replace
    # measured again and not recommended: the row loses its recommended strength and keeps the held-out point
    save_measured(tmp_path, {7: Measured(held(40.0, 0.1))})
    saved = [json.loads(line) for line in (tmp_path / "features.jsonl").read_text().splitlines()]
    assert "recommended_strength" not in saved[1] and saved[1]["held_out"]["strength"] == 40.0
    assert [r["index"] for r in saved] == [3, 7, 9]


def test_save_measured_refuses_a_folder_it_cannot_write(tmp_path, monkeypatch):
    with pytest.raises(InvalidParameter, match="no features.jsonl"):
        save_measured(tmp_path, {1: Measured(held(20.0, 1.0))})
    (tmp_path / "features.jsonl").write_text('{"index": 1}\n')
    # the tests may run as root, who may write anywhere: a read-only folder as os.access reports it
    monkeypatch.setattr("millm.research.saving.os.access", lambda path, mode: False)
    with pytest.raises(InvalidParameter, match="not writable"):
        save_measured(tmp_path, {1: Measured(held(20.0, 1.0))})
    assert (tmp_path / "features.jsonl").read_text() == '{"index": 1}\n'


def test_save_measured_refuses_the_bundled_saes():
    from millm.sae.bundled import BUNDLED_DIR

    folder = BUNDLED_DIR / "smollm2-135m-res-L10"
    before = (folder / "features.jsonl").read_bytes()
    with pytest.raises(InvalidParameter, match="ships inside the package"):
        save_measured(folder, {2375: Measured(held(40.0, 1.0))})
    assert (folder / "features.jsonl").read_bytes() == before


def test_bigram_share_counts_repetition():
    from millm.research.measure import bigram_share

    assert bigram_share("the dog ran to the park") == 1.0
    assert bigram_share("dog dog dog dog dog") == 0.25  # four bigrams, one distinct
    assert bigram_share("one") == 1.0
