"""Strength sweeps: how often a steered feature's concept shows up in answers, and what it costs in fluency.

The one place these measures live (``millm steer sweep``, ``bench/sae_quality.py`` and ``bench/sweep.py``
all use them):

- answers: one seeded sampled answer per neutral prompt (``NEUTRAL_PROMPTS``), as one batch, sampled by
  ``millm.sae.corpus.sample_answers`` (temperature 0.8, top-p 0.95, repetition penalty 1.15), with whatever
  steering the model's hooks hold;
- concept rate: the share of answers that mention a concept word (:func:`mentions`: the word, its plural or
  its singular, as a whole word, any case);
- fluency: the steered answers' mean token log-probability under the unsteered model, minus the unsteered
  answers' own (nats/token); inside the bound when it is >= ``-FLUENCY_BOUND``;
- refinement (:func:`refine`): when no strength inside the bound reaches the target, the sweep adds the
  strength halfway to the next one past the bound (twice, ``REFINE_ROUNDS``), where the best strength lies;
- the recommended strength (:func:`recommend`): the lowest steering strength whose rate reaches
  ``TARGET_RATE`` inside the fluency bound, else the one with the highest (non-zero) rate inside the bound,
  else none.
"""

from __future__ import annotations

import json
import os
import re
import struct
import tempfile
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from millm.errors import InvalidParameter

NEUTRAL_PROMPTS = (
    "Tell me about your day.", "What should I do this weekend?", "Write a short paragraph about anything you like.",
    "Give me some advice for tomorrow.", "Tell me a short story.", "What is your favourite thing?",
    "What did you learn today?", "Write a few sentences about life.", "What makes a good morning?",
    "Tell me something interesting.", "How do you relax?", "What would you do with a free afternoon?",
    "Write a short note to a friend.", "What are you thinking about?", "Describe an ordinary day.",
    "Tell me about a memory.", "What is something you like?", "Write about something that makes you smile.",
    "Plan a simple day for me.", "Say something nice.",
)
FLUENCY_BOUND = 1.5  # nats/token the steered answers may lose against the unsteered answers' own log-prob
TARGET_RATE = 0.6  # share of answers that should mention the concept
SEED = 0
MAX_NEW_TOKENS = 48
STRENGTHS = (0.0, 20.0, 40.0, 60.0, 80.0)
REFINE_ROUNDS = 2  # strengths a sweep adds at the fluency crossing (:func:`refine`): 40/60 gives 50, then 45 or 55
REFINE_CLOSEST = 5.0  # strengths closer than this are not told apart by a few prompts


# concept words and mentions
def _is_word(term: str) -> bool:
    return term.isalpha() and len(term) >= 3


def label_words(label: str) -> tuple[str, ...]:
    """A label's terms (``"rain, storm, weather"``) that are words: what counts as mentioning its concept."""
    terms = (t.strip().lower() for t in label.split(","))
    return tuple(dict.fromkeys(t for t in terms if _is_word(t)))


def top_token_words(row: dict[str, Any]) -> tuple[str, ...]:
    """A ``features.jsonl`` row's top tokens that are words (what bench/sae_quality.py counts as mentions)."""
    return tuple(str(t) for t, _ in row.get("top_tokens") or [] if _is_word(str(t)))


NOT_PLURALS = frozenset({"news", "ones", "means", "lots", "thanks", "series", "species"})  # "new" is not their singular


def _singulars(word: str) -> list[str]:
    if word in NOT_PLURALS:
        return []
    if word.endswith("ies") and len(word) > 4:
        return [word[:-3] + "y", word[:-1]]  # "cities", "movies"
    if word.endswith("es") and word[:-2].endswith(("x", "ch", "sh", "ss", "z")):
        return [word[:-2]]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")) and len(word) > 3:
        return [word[:-1]]
    return []


def word_forms(word: str) -> tuple[str, ...]:
    """A concept word with its plural and its singular, all naming one concept: a label's term is often a
    plural ("dogs") that an answer says in the singular, or the other way round ("city", "cities")."""
    plurals = [word + "s", word + "es"] + ([word[:-1] + "ies"] if word.endswith("y") else [])
    return tuple(dict.fromkeys([word, *plurals, *_singulars(word)]))


def mentions(text: str, words: Iterable[str]) -> bool:
    """A word, its plural or its singular (:func:`word_forms`), as a whole word (any case)."""
    forms = [re.escape(f) for w in words for f in word_forms(w)]
    return bool(forms) and re.search(rf"\b(?:{'|'.join(forms)})\b", text, re.IGNORECASE) is not None


def concept_rate(answers: Sequence[str], words: Iterable[str]) -> float:
    """The share of ``answers`` that mention one of ``words``."""
    words = tuple(words)
    return sum(mentions(a, words) for a in answers) / len(answers) if answers else 0.0


# measuring
ROWS_PER_BATCH = 96  # answers sampled together: a sweep's strengths (and a screen's features) share batches


def chat_pairs(tokenizer: Any, prompts: Sequence[str], answers: Sequence[str]) -> list[tuple[list[int], list[int]]]:
    """Each chat-templated prompt's tokens and its answer's: an answer read back after its prompt."""
    from millm.sae.corpus import _chat_text

    return [(list(tokenizer(_chat_text(tokenizer, p), add_special_tokens=False)["input_ids"]),
             list(tokenizer(a, add_special_tokens=False)["input_ids"])) for p, a in zip(prompts, answers)]


def row_logprobs(model: Any, tokenizer: Any, prompts: Sequence[str], answers: Sequence[str],
                 batch: int = 16) -> list[tuple[float, int]]:
    """Per answer: the sum of its tokens' log-probabilities under ``model`` as its hooks are now (teacher
    forced after its chat-templated prompt), and how many tokens it has."""
    import torch

    pairs = chat_pairs(tokenizer, prompts, answers)
    device = next(model.parameters()).device
    out: list[tuple[float, int]] = []
    with torch.inference_mode():
        for at in range(0, len(pairs), batch):
            chunk = pairs[at:at + batch]
            width = max(len(h) + len(b) for h, b in chunk)
            ids = torch.zeros((len(chunk), width), dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            scored = torch.zeros((len(chunk), width - 1), dtype=torch.bool)
            for i, (head, body) in enumerate(chunk):
                ids[i, :len(head) + len(body)] = torch.tensor(head + body)
                mask[i, :len(head) + len(body)] = 1
                scored[i, len(head) - 1:len(head) + len(body) - 1] = True
            ids, mask, scored = ids.to(device), mask.to(device), scored.to(device)
            logp = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1].float().log_softmax(-1)
            token_logp = logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1) * scored
            out.extend((float(total), int(count)) for total, count in zip(token_logp.sum(-1), scored.sum(-1)))
    return out


def mean_logprob(model: Any, tokenizer: Any, prompts: Sequence[str], answers: Sequence[str]) -> float:
    """Mean log-probability per answer token under ``model`` as its hooks are now (teacher forced)."""
    rows = row_logprobs(model, tokenizer, prompts, answers)
    return sum(t for t, _ in rows) / max(1, sum(c for _, c in rows))


@dataclass(frozen=True)
class Point:
    """One strength of a sweep."""

    strength: float
    rate: float  # share of answers that mention the concept
    logprob: float  # the answers' mean token log-prob under the unsteered model
    fluency: float  # logprob minus the unsteered answers' own (nats/token; 0 unsteered)
    inside: bool  # fluency >= -FLUENCY_BOUND
    example: str = ""  # the first answer


@dataclass(frozen=True)
class Case:
    """What steers one set of answers (per SAE, feature -> strength), the words that count as its concept,
    and the strength its point reports (a feature's strength, or a dial's λ)."""

    strength: float
    values: Mapping[str, Mapping[int, float]]
    words: tuple[str, ...]

    @classmethod
    def feature(cls, sae_id: str, feature: int, strength: float, words: Sequence[str]) -> Case:
        """One feature of one SAE alone at ``strength``."""
        return cls(strength, {sae_id: {feature: strength}} if strength else {}, tuple(words))


@dataclass
class SweepResult:
    sae: str
    layer: int
    feature: int
    label: str
    words: tuple[str, ...]
    prompts: int
    tokens: int
    seed: int
    unsteered_rate: float
    unsteered_logprob: float
    points: list[Point] = field(default_factory=list)
    bound: float = FLUENCY_BOUND
    target: float = TARGET_RATE

    @property
    def recommended(self) -> float | None:
        return recommend(self.points, self.target, self.bound)

    def point(self, strength: float | None) -> Point | None:
        return next((p for p in self.points if p.strength == strength), None)

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["words"] = list(self.words)
        body["recommended_strength"] = self.recommended
        return body


def recommend(points: Sequence[Point], target: float = TARGET_RATE, bound: float = FLUENCY_BOUND) -> float | None:
    """The lowest strength (by size; 0 steers nothing and is never recommended) whose concept rate reaches
    ``target`` with fluency inside ``-bound``; else the strength with the highest non-zero rate inside the
    bound (the lower on a tie); else None."""
    steered = sorted((p for p in points if p.strength != 0 and p.fluency >= -bound), key=lambda p: abs(p.strength))
    reached = [p for p in steered if p.rate >= target]
    if reached:
        return reached[0].strength
    best = max(steered, key=lambda p: p.rate, default=None)  # max keeps the first (lowest) of equals
    return best.strength if best is not None and best.rate > 0 else None


def refine(points: Sequence[Point], target: float = TARGET_RATE, bound: float = FLUENCY_BOUND,
           closest: float = REFINE_CLOSEST) -> float | None:
    """The strength to measure next, when no strength inside the fluency bound reaches ``target``: halfway
    between the strongest one inside the bound and the next one past it (on one side of 0; positive
    first). The rate tends to rise with the strength until fluency gives way, so the best strength lies
    near that crossing, which a coarse grid (40 inside, 60 past) can step over. None when no side has such
    a crossing, or its two strengths are within ``2 * closest`` of each other, or the side never mentions
    the concept at all."""
    for sign in (1, -1):
        side = sorted((p for p in points if p.strength * sign > 0), key=lambda p: abs(p.strength))
        inside = [p for p in side if p.fluency >= -bound]
        if not inside or any(p.rate >= target for p in inside) or not any(p.rate > 0 for p in side):
            continue
        below = inside[-1]
        past = next((p for p in side if abs(p.strength) > abs(below.strength)), None)
        if past is not None and abs(past.strength - below.strength) >= 2 * closest:
            return (below.strength + past.strength) / 2
    return None


class Measure:
    """Answers to the first ``prompts`` neutral prompts under each case's steering alone, measured against
    the unsteered answers (sampled and scored once, with every SAE's steering suppressed)."""

    def __init__(self, model: Any, tokenizer: Any, steering: Any, prompts: Sequence[str] = NEUTRAL_PROMPTS,
                 seed: int = SEED, tokens: int = MAX_NEW_TOKENS, bound: float = FLUENCY_BOUND) -> None:
        self.model, self.tokenizer, self.steering = model, tokenizer, steering
        self.prompts, self.seed, self.tokens, self.bound = tuple(prompts), seed, tokens, bound
        with steering.suppressed():
            self.plain = self.answers(list(self.prompts))
            self.plain_logprob = self.unsteered_logprob(self.plain)

    def answers(self, prompts: list[str], seed: int | None = None) -> list[str]:
        from millm.sae.corpus import sample_answers

        return sample_answers(self.model, self.tokenizer, prompts, self.seed if seed is None else seed, self.tokens)

    def unsteered_logprob(self, answers: Sequence[str]) -> float:
        with self.steering.suppressed():
            return mean_logprob(self.model, self.tokenizer, self.prompts, answers)

    def points(self, cases: Sequence[Case]) -> list[Point]:
        """Each case measured: its answers are sampled in batches of rows, each row steered by its own case
        alone (``Steering.each_row``: live values and other requests' rows are untouched), then scored by
        the unsteered model. A case that steers nothing is the unsteered answers themselves."""
        from millm.steering.core import Override

        per = len(self.prompts)
        steered = [c for c in cases if any(c.values.values())]
        group = max(1, ROWS_PER_BATCH // per)
        answers: list[str] = []
        for at in range(0, len(steered), group):
            chunk = steered[at:at + group]
            overrides = [Override("sweep", {sae: dict(v) for sae, v in c.values.items()})
                         for c in chunk for _ in range(per)]
            with self.steering.each_row(overrides):
                answers += self.answers(list(self.prompts) * len(chunk), self.seed + at)
        with self.steering.suppressed():
            scored = row_logprobs(self.model, self.tokenizer, list(self.prompts) * len(steered), answers)
        measured = {}
        for n, case in enumerate(steered):
            mine, rows = answers[n * per:(n + 1) * per], scored[n * per:(n + 1) * per]
            lp = sum(t for t, _ in rows) / max(1, sum(c for _, c in rows))
            measured[id(case)] = self._point(case, mine, lp)
        return [measured[id(c)] if id(c) in measured else self._point(c, self.plain, self.plain_logprob)
                for c in cases]

    def _point(self, case: Case, answers: Sequence[str], logprob: float) -> Point:
        fluency = logprob - self.plain_logprob
        return Point(case.strength, concept_rate(answers, case.words), logprob, fluency, fluency >= -self.bound,
                     answers[0] if answers else "")

    def at(self, sae_id: str, feature: int, strength: float, words: Iterable[str]) -> Point:
        """``feature`` alone steered at ``strength`` on ``sae_id``."""
        return self.points([Case.feature(sae_id, feature, strength, tuple(words))])[0]


def swept_points(measure: Measure, sweeps: Sequence[Callable[[float], Case]], strengths: Sequence[float],
                 rounds: int = REFINE_ROUNDS) -> list[list[Point]]:
    """Each sweep (its case at a strength) measured at every strength, all sampled together, then with up to
    ``rounds`` strengths added where :func:`refine` asks for one, every round's strengths sampled together;
    points in strength order."""
    points = measure.points([at(s) for at in sweeps for s in strengths])
    n = len(strengths)
    out = [sorted(points[i * n:(i + 1) * n], key=lambda p: p.strength) for i in range(len(sweeps))]
    for _ in range(rounds):
        asked = [(i, s) for i, mine in enumerate(out) if (s := refine(mine, bound=measure.bound)) is not None]
        if not asked:
            break
        for (i, _), point in zip(asked, measure.points([sweeps[i](s) for i, s in asked])):
            out[i] = sorted([*out[i], point], key=lambda p: p.strength)
    return out


def need_words(feature: int, words: Sequence[str]) -> Sequence[str]:
    """``words``, or a refusal naming --concept when the feature's label gave none to look for."""
    if not words:
        raise InvalidParameter(f"Feature {feature} has no label words to look for; name them with --concept.",
                               param="concept")
    return words


def run_sweep(measure: Measure, sae_id: str, layer: int, feature: int, label: str, words: Sequence[str],
              strengths: Sequence[float]) -> SweepResult:
    """``feature`` of ``sae_id`` (attached at ``layer`` on ``measure``'s steering) at each strength, the
    strengths sampled together, then refined at the fluency crossing (:func:`swept_points`)."""
    words = tuple(w.lower() for w in need_words(feature, words))
    result = SweepResult(sae_id, layer, feature, label, words, len(measure.prompts), measure.tokens, measure.seed,
                         concept_rate(measure.plain, words), measure.plain_logprob, bound=measure.bound)
    [result.points] = swept_points(measure, [partial(Case.feature, sae_id, feature, words=words)], strengths)
    return result


def check_sizes(prompts: int, tokens: int) -> None:
    """The neutral prompts and tokens per answer a sweep may ask for."""
    if not 1 <= prompts <= len(NEUTRAL_PROMPTS):
        raise InvalidParameter(f"--prompts must be 1-{len(NEUTRAL_PROMPTS)}.", param="prompts")
    if not 1 <= tokens <= 512:
        raise InvalidParameter("--tokens must be 1-512.", param="tokens")


def sweep_feature(service: Any, target: Any, model: Any, tokenizer: Any, sae_id: str, feature: int, *,
                  label: str = "", words: Sequence[str] = (), strengths: Sequence[float] = STRENGTHS,
                  prompts: int = 8, seed: int = SEED, tokens: int = MAX_NEW_TOKENS,
                  layer: int | None = None) -> SweepResult:
    """A sweep on a loaded model (``target``, a ``SteeringTarget`` of ``service``'s registry): ``sae_id`` is
    attached for the sweep only (``millm chat --sae``'s session: at ``layer``, default where it is attached,
    else its hint; an SAE on that layer set aside); live values steer none of the sweep's answers, and
    afterwards attachments, values and the active profile are as they were; nothing is persisted.
    ``words`` default to the label's (:func:`label_words`)."""
    from millm.local import chat_steering

    check_sizes(prompts, tokens)
    words = need_words(feature, tuple(words) or label_words(label))  # before anything is attached
    steering = target.steering
    with chat_steering(service, target, sae_id, layer, {}, None):
        measure = Measure(model, tokenizer, steering, NEUTRAL_PROMPTS[:prompts], seed, tokens)
        return run_sweep(measure, sae_id, steering.attachments[sae_id].layer, feature, label, words, strengths)


def parse_strengths(text: str) -> list[float]:
    """``"0,20,40"`` as strengths (each within ±200, no repeats)."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InvalidParameter(f"--strengths '{text}' is not a comma-separated list of numbers.",
                               param="strengths") from None
    if not values or any(not -200 <= v <= 200 for v in values) or len(set(values)) != len(values):
        raise InvalidParameter(f"--strengths '{text}': give distinct numbers within -200..200.", param="strengths")
    return values


# the recommendation, stored
def saveable(folder: str | Path) -> Path:
    """The ``features.jsonl`` a recommended strength can be written into; refused for an SAE without the file,
    a folder or file not writable, or an SAE shipped inside the package (measure a copy of it instead)."""
    from millm.sae.bundled import BUNDLED_DIR
    from millm.sae.cards import FEATURES_FILE, folder_of

    base = folder_of(folder)
    path = base / FEATURES_FILE
    if base.resolve().is_relative_to(BUNDLED_DIR.resolve()):
        raise InvalidParameter(f"{base.name} ships inside the package and is not changed by --save: copy its folder "
                               f"({base}) somewhere of yours and sweep it with --sae FOLDER --save.", param="save")
    if not path.is_file():
        raise InvalidParameter(f"{base} has no {FEATURES_FILE} to record the recommended strength in.", param="save")
    if not (os.access(base, os.W_OK) and os.access(path, os.W_OK)):
        raise InvalidParameter(f"{path} is not writable here: the recommended strength was not saved "
                               "(copy the SAE to a folder of yours and register that).", param="save")
    return path


@dataclass(frozen=True)
class Recommendation:
    """What a sweep found for one feature: its recommended strength and the concept rate there."""

    strength: float
    rate: float
    label: str = ""


def save_recommendations(folder: str | Path, found: Mapping[int, Recommendation | None]) -> Path:
    """Write each feature's ``recommended_strength`` and ``concept_rate`` into its row of the SAE's
    ``features.jsonl`` (a row is added for a feature that has none); a feature mapped to None was measured
    again and steers no more, so its row loses both. One atomic replace; refused where :func:`saveable`
    refuses."""
    from millm.sae.cards import MEASURED_KEY, RATE_KEY

    path = saveable(folder)
    lines = path.read_text(encoding="utf-8").splitlines()
    left = dict(found)
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        row = json.loads(line)
        index = int(row.get("index", -1))
        if index not in left:
            continue
        rec = left.pop(index)
        if rec is None:
            row.pop(MEASURED_KEY, None)
            row.pop(RATE_KEY, None)
        else:
            row[MEASURED_KEY], row[RATE_KEY] = rec.strength, rec.rate
        lines[n] = json.dumps(row, ensure_ascii=False)
    for index, rec in sorted(left.items()):
        if rec is not None:
            lines.append(json.dumps({"index": index, "label": rec.label, MEASURED_KEY: rec.strength,
                                     RATE_KEY: rec.rate}, ensure_ascii=False))
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".features-", suffix=".jsonl")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# plots
def bar_lines(points: Sequence[Point], width: int = 30, bound: float = FLUENCY_BOUND) -> list[str]:
    """A text plot: one bar per strength, its length the concept rate."""
    shown = [f"{p.strength:g}" for p in points]
    pad = max((len(s) for s in shown), default=1)
    lines = []
    for s, p in zip(shown, points):
        bar = "█" * round(p.rate * width)
        mark = "inside" if p.inside else f"past -{bound:g}"
        lines.append(f"{s:>{pad}} │{bar:<{width}}│ {p.rate:4.0%}  fluency {p.fluency:+.2f} ({mark})")
    return lines


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bytes(pixels: Sequence[Sequence[tuple[int, int, int]]]) -> bytes:
    """An 8-bit RGB PNG of ``pixels`` (rows of (r, g, b))."""
    height, width = len(pixels), len(pixels[0]) if pixels else 0
    raw = b"".join(b"\x00" + bytes(c for px in row for c in px) for row in pixels)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


GREEN, RED, GREY, WHITE, BLUE = (46, 160, 67), (207, 34, 46), (200, 200, 200), (255, 255, 255), (9, 105, 218)


def bar_chart(points: Sequence[Point], target: float = TARGET_RATE, bar: int = 40, gap: int = 16,
              height: int = 200, margin: int = 20) -> list[list[tuple[int, int, int]]]:
    """Pixels of a bar chart: a bar per strength (in order), its height the concept rate, green inside the
    fluency bound and red past it; a grey line at 0% and 100%, a blue line at the target rate."""
    width = margin * 2 + len(points) * bar + max(0, len(points) - 1) * gap
    total = height + margin * 2
    img = [[WHITE] * width for _ in range(total)]
    floor, top = margin + height, margin

    def hline(y: int, colour: tuple[int, int, int]) -> None:
        for x in range(margin // 2, width - margin // 2):
            img[y][x] = colour

    hline(floor, GREY)
    hline(top, GREY)
    for i, p in enumerate(points):
        x0 = margin + i * (bar + gap)
        rise = round(max(0.0, min(1.0, p.rate)) * height)
        colour = GREEN if p.inside else RED
        for y in range(floor - rise, floor):
            for x in range(x0, x0 + bar):
                img[y][x] = colour
    hline(floor - round(target * height), BLUE)
    return img


def write_png(path: str | Path, points: Sequence[Point], target: float = TARGET_RATE) -> Path:
    path = Path(path)
    path.write_bytes(png_bytes(bar_chart(points, target)))
    return path
