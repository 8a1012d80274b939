"""Screening every labelled feature of an SAE for steering: a cheap estimate for all, the sweep's own measure
for the promising ones, and a recommended strength for each feature that steers its label.

Sweeping thousands of features by sampling answers is hours on a CPU, so the screen has two stages:

- estimate (teacher forced, nothing sampled): the unsteered answers to a few neutral prompts are read
  again with the feature's delta added at its layer (the layers below it run once for all features); at
  each answer position, the steered model's probability of starting one of the label's words
  (:func:`word_tokens`); an answer's chance of mentioning the concept is estimated as ``1 - prod(1 - p)``,
  averaged over the answers, and the feature's estimate is how much its delta raises that over the
  unsteered model's own;
- measure: a feature whose estimate rises by ``FLOOR`` or more is swept with ``millm.steering.sweep``
  (sampled answers, concept rate, fluency against the unsteered answers, refined at the fluency crossing),
  and its recommended strength is that sweep's (:func:`millm.steering.sweep.recommend`), when some
  strength mentions the concept more often than the unsteered answers do.

A feature the estimate passes over is not recorded: the screen says nothing about it, and ``millm steer
sweep`` measures it on demand.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from millm.steering.sweep import (
    NEUTRAL_PROMPTS,
    ROWS_PER_BATCH,
    SEED,
    Case,
    Measure,
    Point,
    chat_pairs,
    check_sizes,
    concept_rate,
    label_words,
    recommend,
    swept_points,
    word_forms,
)

FLOOR = 0.2  # estimated rise in the chance of a mention that earns a feature the sampled sweep
ESTIMATE_STRENGTHS = (60.0,)
SWEEP_STRENGTHS = (20.0, 40.0, 60.0, 80.0)
ROWS = 48  # steered answers read per forward


@dataclass(frozen=True)
class Screened:
    """One feature the sampled sweep measured."""

    feature: int
    label: str
    estimate: float  # the estimated rise in the chance of a mention (the best over ESTIMATE_STRENGTHS)
    baseline: float  # the unsteered answers' concept rate
    points: list[Point]

    @property
    def recommended(self) -> float | None:
        """The sweep's recommended strength, when some strength mentions the concept more often than the
        unsteered answers do (a label's word the model says anyway is not steering)."""
        return recommend(self.points) if any(p.rate > self.baseline for p in self.points) else None

    @property
    def rate(self) -> float:
        """The concept rate at the recommended strength (0 when there is none)."""
        best = next((p for p in self.points if p.strength == self.recommended), None)
        return best.rate if best is not None else 0.0


@dataclass
class Screen:
    """A screen's findings: every labelled feature's estimate, and the sampled sweeps of those it picked."""

    estimates: dict[int, float]
    swept: list[Screened]
    prompts: int
    tokens: int
    seed: int

    @property
    def steers(self) -> list[Screened]:
        """The swept features with a recommended strength."""
        return [s for s in self.swept if s.recommended is not None]


def word_tokens(tokenizer: Any, words: Sequence[str]) -> list[int]:
    """The tokens that start a mention of one of ``words``: each word's forms (``word_forms``), bare and after a space,
    lower case and capitalised, where that form is one token. A form the tokenizer splits is left out, since
    its first piece starts many other words too (" sport" is one token, "sport" starts with "s")."""
    ids = set()
    for word in words:
        for form in word_forms(word):
            for cased in (form, form.capitalize()):
                for text in (cased, " " + cased):
                    got = tokenizer(text, add_special_tokens=False)["input_ids"]
                    if len(got) == 1:
                        ids.add(int(got[0]))
    return sorted(ids)


class Contexts:
    """Unsteered answers as teacher-forced rows (``pairs`` of prompt and answer tokens): left padded so that
    every answer ends at the last column, with the residual after ``layer`` computed once (unsteered:
    ``steering`` is suppressed)."""

    def __init__(self, model: Any, steering: Any, pairs: Sequence[tuple[list[int], list[int]]], layer: int) -> None:
        base = model.model
        if not all(hasattr(base, name) for name in ("layers", "rotary_emb", "norm")):
            raise ValueError("Screening runs the layers above the SAE directly, which needs a Llama-style model "
                             "(model.layers, rotary_emb, norm); sweep features one by one instead.")
        if not pairs:
            raise ValueError("The unsteered answers are empty: nothing to read steering against.")
        self.model, self.layer = model, layer
        width = max(len(h) + len(b) for h, b in pairs)
        self.span = max(len(b) for _, b in pairs)  # answer columns: the last ``span`` columns
        device = next(model.parameters()).device
        ids = torch.zeros((len(pairs), width), dtype=torch.long)
        mask = torch.zeros((len(pairs), width), dtype=torch.long)
        answer = torch.zeros((len(pairs), self.span), dtype=torch.bool)
        for i, (head, body) in enumerate(pairs):
            ids[i, width - len(head) - len(body):] = torch.tensor(head + body)
            mask[i, width - len(head) - len(body):] = 1
            answer[i, self.span - len(body):] = True
        self.mask, self.answer = mask.to(device), answer.to(device)
        self.positions = (self.mask.cumsum(-1) - 1).clamp(min=0)
        seen: list[torch.Tensor] = []

        def keep(module: Any, args: Any, output: Any) -> None:
            seen.append(output[0] if isinstance(output, tuple) else output)

        handle = base.layers[layer].register_forward_hook(keep)  # what the steering hook on ``layer`` sees
        try:
            with torch.inference_mode(), steering.suppressed():
                out = model(input_ids=ids.to(device), attention_mask=self.mask, position_ids=self.positions,
                            use_cache=False, logits_to_keep=self.span + 1)
        finally:
            handle.remove()
        self.residual = seen[0]
        self.plain = out.logits[:, :-1].float().log_softmax(-1)  # unsteered, at the answer columns

    def __len__(self) -> int:
        return int(self.residual.shape[0])

    @torch.inference_mode()
    def mention_chance(self, deltas: torch.Tensor, token_ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """Per delta (``[n, d_model]``, each with its own concept tokens): the estimated chance that an
        answer mentions the concept, averaged over the contexts."""
        from transformers.masking_utils import create_causal_mask

        base, c = self.model.model, len(self)
        n = deltas.shape[0]
        hidden = (self.residual.unsqueeze(0) + deltas[:, None, None, :].to(self.residual.dtype)).flatten(0, 1)
        mask = self.mask.repeat(n, 1)
        positions = self.positions.repeat(n, 1)
        causal = create_causal_mask(config=base.config, inputs_embeds=hidden, attention_mask=mask, cache=None,
                                    position_ids=positions)
        rotary = base.rotary_emb(hidden, position_ids=positions)
        for layer in base.layers[self.layer + 1:]:
            hidden = layer(hidden, attention_mask=causal, position_embeddings=rotary, position_ids=positions,
                           use_cache=False)
        # the token at answer column j is predicted at the column before it
        last = base.norm(hidden[:, -self.span - 1:-1])
        logp = self.model.lm_head(last).float().log_softmax(-1)  # [n*c, span, vocab]
        return torch.tensor([self._chance(logp[i * c:(i + 1) * c], ids) for i, ids in enumerate(token_ids)])

    def baseline(self, token_ids: Sequence[int]) -> float:
        """The unsteered model's estimated chance of a mention (the same estimate, no delta)."""
        return self._chance(self.plain, token_ids)

    def _chance(self, logp: torch.Tensor, token_ids: Sequence[int]) -> float:
        if not token_ids:
            return 0.0
        p = logp[..., list(token_ids)].logsumexp(-1).exp().clamp(max=1.0) * self.answer
        return float((1 - (1 - p).prod(-1)).mean())


def estimate(contexts: Contexts, sae: Any, tokenizer: Any, features: Sequence[tuple[int, Sequence[str]]],
             strengths: Sequence[float] = ESTIMATE_STRENGTHS,
             on_progress: Callable[[int, int], None] | None = None) -> dict[int, float]:
    """Per feature (with its concept words): how much steering it raises the estimated mention chance over
    the unsteered model's (the best over ``strengths``)."""
    tokens = {f: word_tokens(tokenizer, words) for f, words in features}
    cases = [(f, s) for f, _ in features for s in strengths]
    per = max(1, ROWS // len(contexts))
    best: dict[int, float] = {}
    dec = sae.W_dec
    for at in range(0, len(cases), per):
        chunk = cases[at:at + per]
        index = torch.tensor([f for f, _ in chunk], device=dec.device)
        scale = torch.tensor([s for _, s in chunk], device=dec.device, dtype=dec.dtype)
        chances = contexts.mention_chance(scale[:, None] * dec[index], [tokens[f] for f, _ in chunk])
        for (f, _), chance in zip(chunk, chances.tolist()):
            best[f] = max(best.get(f, 0.0), chance)
        if on_progress is not None:
            on_progress(min(at + per, len(cases)), len(cases))
    return {f: chance - contexts.baseline(tokens[f]) for f, chance in best.items()}


def screen(measure: Measure, sae_id: str, sae: Any, layer: int, labels: dict[int, str],
           context_prompts: int = 2, floor: float = FLOOR, limit: int | None = None,
           strengths: Sequence[float] = SWEEP_STRENGTHS, skip: Collection[int] = (),
           on_progress: Callable[[str, int, int], None] | None = None,
           on_swept: Callable[[list[Screened]], None] | None = None) -> Screen:
    """Every feature of ``labels`` with concept words estimated; those whose estimate rises by ``floor`` or
    more, but for ``skip`` (the ``limit`` highest, if given), swept with ``measure`` (whose steering has
    ``sae_id`` attached at ``layer``), highest estimate first; ``on_swept`` gets each batch of swept
    features as it is done (so a long screen can keep what it found)."""
    features = [(f, label_words(label)) for f, label in sorted(labels.items())]
    features = [(f, w) for f, w in features if w]
    pairs = [(h, b) for h, b in chat_pairs(measure.tokenizer, measure.prompts[:context_prompts],
                                           measure.plain[:context_prompts]) if b]  # empty answers say nothing
    contexts = Contexts(measure.model, measure.steering, pairs, layer)
    progress = (lambda done, total: on_progress("estimate", done, total)) if on_progress else None
    rises = estimate(contexts, sae, measure.tokenizer, features, on_progress=progress) if features else {}
    words = dict(features)
    chosen = sorted((f for f in rises if rises[f] >= floor and f not in skip), key=lambda f: -rises[f])[:limit]
    swept = []
    per = max(1, ROWS_PER_BATCH // (len(measure.prompts) * len(strengths)))
    for at in range(0, len(chosen), per):
        batch = chosen[at:at + per]
        found = swept_points(measure, [partial(Case.feature, sae_id, f, words=words[f]) for f in batch], strengths)
        done = [Screened(f, labels[f], rises[f], concept_rate(measure.plain, words[f]), mine)
                for f, mine in zip(batch, found)]
        swept += done
        if on_swept is not None:
            on_swept(done)
        if on_progress is not None:
            on_progress("sweep", min(at + per, len(chosen)), len(chosen))
    return Screen(rises, swept, len(measure.prompts), measure.tokens, measure.seed)


def screen_sae(service: Any, target: Any, model: Any, tokenizer: Any, sae_id: str, labels: dict[int, str], *,
               prompts: int = 4, tokens: int = 24, seed: int = SEED, limit: int | None = None, floor: float = FLOOR,
               layer: int | None = None, skip: Collection[int] = (),
               on_progress: Callable[[str, int, int], None] | None = None,
               on_swept: Callable[[list[Screened]], None] | None = None) -> Screen:
    """A screen on a loaded model, with ``sae_id`` attached for it only, as ``sweep_feature`` does."""
    from millm.local import chat_steering

    check_sizes(prompts, tokens)
    steering = target.steering
    with chat_steering(service, target, sae_id, layer, {}, None):
        att = steering.attachments[sae_id]
        measure = Measure(model, tokenizer, steering, NEUTRAL_PROMPTS[:prompts], seed, tokens)
        return screen(measure, sae_id, att.sae, att.layer, labels, floor=floor, limit=limit, skip=skip,
                      on_progress=on_progress, on_swept=on_swept)
