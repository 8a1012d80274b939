"""Scoring mode: the next-token distribution of a prompt, as pure functions over one logits row.

Scoring is one forward pass per prompt and generates nothing. ``temperature`` divides the logits
(0 means no scaling); with ``allowed`` ids the log-probabilities are normalised over that set only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from millm.engine.params import Forced, Prompt
from millm.errors import InvalidParameter, InvalidScoringRequest, NonFiniteLogits

if TYPE_CHECKING:
    import torch

    from millm.steering.target import ReadoutAsk

MAX_LOGPROBS = 20


@dataclass(frozen=True)
class ScoringParams:
    """A validated scoring ask. ``top_n`` is how many alternatives to report (0: only the chosen token)."""

    allowed: tuple[int, ...] | None
    temperature: float
    top_n: int
    report: bool  # False: allowed_token_ids without logprobs, so logprobs come back null
    token_ids_as_keys: bool = False
    echo: bool = False  # also score every prompt token given the tokens before it (echo: true)
    next_token: bool = True  # score the next token too (max_tokens 1; echo allows 0)


@dataclass(frozen=True)
class ScoreRow:
    """One prompt to score; ``where`` names it in errors (``prompt[3]``, ``extra_messages[0]``)."""

    prompt: Prompt
    params: ScoringParams
    where: str = "prompt"
    echo_from: int = 0  # with echo: the first prompt token scored (research reads an answer, not its prompt)


@dataclass(frozen=True)
class ScoreRequest:
    """Rows scored in padded batches, or ``one_at_a_time`` (chat conversations, each failing on its own); with
    ``readout`` (return_sae_activations, one row) the SAE activations of the scoring pass too."""

    rows: list[ScoreRow]
    one_at_a_time: bool = False
    batch_size: int = 32
    readout: ReadoutAsk | None = None


@dataclass(frozen=True)
class TokenScore:
    token_id: int
    logprob: float


@dataclass(frozen=True)
class PromptToken:
    """One echoed prompt token: its log-probability given the tokens before it (None for the first) and the
    top alternatives at its position."""

    token_id: int
    logprob: float | None
    top: list[TokenScore]


@dataclass(frozen=True)
class ScoreResult:
    chosen: TokenScore  # the next token (computed with echo and max_tokens 0 too, then not reported)
    top: list[TokenScore]
    prompt_tokens: int = 0
    echo: list[PromptToken] | None = None
    prompt_ids: tuple[int, ...] = ()
    readout: dict[str, Any] | None = None  # the request's read-out body, on the row it read


def check_allowed(ids: Any) -> tuple[int, ...]:
    """A non-empty list of token ids (duplicates dropped, order kept); the vocabulary is the engine's check."""
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise InvalidParameter("'allowed_token_ids' must be a non-empty list of token ids.", param="allowed_token_ids")
    return tuple(dict.fromkeys(ids))


def check_in_vocab(params: ScoringParams, vocab_size: int) -> None:
    """Every allowed id inside the loaded model's vocabulary."""
    if bad := [i for i in params.allowed or () if not 0 <= i < vocab_size]:
        raise InvalidScoringRequest(f"'allowed_token_ids' has {bad[0]}, outside this model's vocabulary "
                                    f"(0-{vocab_size - 1}).", param="allowed_token_ids")


def check_top_n(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LOGPROBS:
        raise InvalidParameter(f"'{name}' must be an integer from 0 to {MAX_LOGPROBS}, got {value!r}.", param=name)
    return value


def check_scoring_shape(fields: Mapping[str, Any], echo: bool = False) -> None:
    """Scoring needs max_tokens 1 (or max_completion_tokens 1; with echo also 0), n 1 and no streaming."""
    name = "max_tokens" if fields.get("max_tokens") is not None else "max_completion_tokens"
    budget = fields.get(name)
    if budget not in ((0, 1) if echo else (1,)) or isinstance(budget, bool):
        raise InvalidParameter(f"Scoring mode (logprobs / allowed_token_ids) needs max_tokens: 1, got {budget!r}; "
                               "logprobs are not returned for generated text.", param=name)
    if fields.get("n") not in (None, 1) or isinstance(fields.get("n"), bool):
        raise InvalidParameter("Scoring mode needs n: 1.", param="n")
    if fields.get("stream"):
        raise InvalidParameter("Scoring mode cannot be streamed; send stream: false.", param="stream")


def echo_row(logprobs: torch.Tensor, ids: list[int], top_n: int) -> list[PromptToken]:
    """Echoed prompt tokens from ``logprobs[i]`` (the log-softmax at position i, predicting token i + 1)."""
    import torch

    out = [PromptToken(ids[0], None, [])]
    if len(ids) > 1:
        picked = logprobs[:-1].gather(-1, torch.tensor(ids[1:], device=logprobs.device).view(-1, 1)).view(-1)
        top = logprobs[:-1].topk(top_n, dim=-1) if top_n else None
        for i, (token, lp) in enumerate(zip(ids[1:], picked.tolist())):
            alternatives = [] if top is None else [TokenScore(int(t), float(v)) for v, t in
                                                   zip(top.values[i].tolist(), top.indices[i].tolist())]
            out.append(PromptToken(token, float(lp), alternatives))
    if any(p.logprob is not None and not math.isfinite(p.logprob) for p in out):
        raise NonFiniteLogits("The model produced a non-finite log-probability for a prompt token.")
    return out


def echo_result(ids: list[int], logits: torch.Tensor, params: ScoringParams, start: int) -> ScoreResult:
    """One echoed row: its tokens from ``start`` on with their log-probabilities (those before listed without
    one) and its next token, from ``logits`` whose last rows are its positions ``start - 1`` .. end (left
    padding)."""
    import torch

    real = logits[-(len(ids) - start + 1):]
    scaled = real / params.temperature if params.temperature > 0 else real
    echo = echo_row(torch.log_softmax(scaled.double(), dim=-1), ids[start - 1:], params.top_n)
    last = score_row(real[-1].cpu(), params, len(ids))
    return ScoreResult(last.chosen, last.top, len(ids), [PromptToken(t, None, []) for t in ids[:start - 1]] + echo)


def _candidates(logits: torch.Tensor, params: ScoringParams) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The row scaled by the temperature (0: unscaled), and the allowed ids with their logits (None: every id)."""
    import torch

    logits = logits.double()
    if params.temperature > 0:
        logits = logits / params.temperature
    if params.allowed is None:
        return None, logits
    ids = torch.tensor(params.allowed)
    return ids, logits[ids]


def score_row(logits: torch.Tensor, params: ScoringParams, prompt_tokens: int = 0) -> ScoreResult:
    """Score one ``[vocab]`` logits row: the most probable (allowed) token and the top alternatives."""
    import torch

    ids, candidates = _candidates(logits, params)
    if torch.isnan(candidates).any() or torch.isposinf(candidates).any():
        raise NonFiniteLogits("The model produced NaN or +inf logits for this prompt; it cannot be scored.")
    logprobs = torch.log_softmax(candidates, dim=-1)
    count = len(candidates) if params.allowed is not None else max(params.top_n, 1)
    top = torch.topk(logprobs, min(count, len(candidates)))
    scores = [TokenScore(int(ids[i]) if ids is not None else int(i), float(lp))
              for lp, i in zip(top.values.tolist(), top.indices.tolist())]
    if not math.isfinite(scores[0].logprob) or any(math.isinf(s.logprob) for s in scores[:max(params.top_n, 1)]):
        raise NonFiniteLogits("A reported token has a -inf logit; it cannot be scored.")
    return ScoreResult(scores[0], scores, prompt_tokens)


def same_forward(reads: Sequence[Forced]) -> list[list[int]]:
    """Indices of ``reads`` grouped by the forward they need, in order of first use: unsteered reads of the
    same tokens share one; a steered read has its own (steerings are not compared)."""
    groups: dict[object, list[int]] = {}
    for i, r in enumerate(reads):
        groups.setdefault((r.ids, r.start) if r.steering is None or r.steering.values is None else i, []).append(i)
    return list(groups.values())


def watched(row: torch.Tensor, span: int, watch: Sequence[int]) -> list[float]:
    """At each of the last ``span`` tokens of a read, the probability that the token there is one of ``watch``,
    from ``row`` (``[positions, vocab]`` logits ending at the read's end; the token at i is predicted at i - 1)."""
    if not watch or span == 0:
        return [0.0] * span
    predicting = row[-span - 1:-1]
    chances = predicting[:, list(watch)].logsumexp(-1) - predicting.logsumexp(-1)
    return chances.exp().clamp(max=1.0).tolist()
