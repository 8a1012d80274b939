"""Scoring responses: OpenAI-shaped logprobs objects for completions and chat. Checking lives in the request
builder and running (the SAE read-out of the scoring pass included) in the engine; this module renders."""

from __future__ import annotations

from typing import Any

from millm.engine.base import Engine
from millm.engine.scoring import ScoreResult, ScoringParams, TokenScore
from millm.render.shapes import CompletionShape


def _key(engine: Engine, score: TokenScore, params: ScoringParams) -> str:
    return f"token_id:{score.token_id}" if params.token_ids_as_keys else engine.token_text(score.token_id)


def _top(engine: Engine, scores: list[TokenScore], params: ScoringParams) -> dict[str, float]:
    """Alternatives keyed by text (or token id); texts that two ids share are one entry (the likelier)."""
    top: dict[str, float] = {}
    for score in scores[:params.top_n]:
        top.setdefault(_key(engine, score, params), score.logprob)
    return top


def completion_logprobs(engine: Engine, result: ScoreResult, params: ScoringParams,
                        prompt: str) -> dict[str, Any] | None:
    """OpenAI's legacy logprobs object. With echo it covers the prompt tokens first (the first has no
    log-probability), then the next token unless max_tokens was 0; offsets run over the echoed text."""
    if not params.report:
        return None
    tokens: list[str] = []
    logprobs: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    text = "" if params.echo else prompt
    for p in result.echo or []:
        tokens.append(_key(engine, TokenScore(p.token_id, 0.0), params))
        logprobs.append(p.logprob)
        tops.append(None if p.logprob is None else _top(engine, p.top, params))
        offsets.append(len(text))
        text += engine.token_text(p.token_id)
    if params.next_token:
        tokens.append(_key(engine, result.chosen, params))
        logprobs.append(result.chosen.logprob)
        tops.append(_top(engine, result.top, params))
        offsets.append(len(text))
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}


def completion_text(engine: Engine, result: ScoreResult, params: ScoringParams, prompt: str) -> str:
    """The choice's text: the next token, after the prompt when echoed."""
    answer = engine.token_text(result.chosen.token_id) if params.next_token else ""
    return prompt + answer if params.echo else answer


def chat_logprobs(engine: Engine, result: ScoreResult, params: ScoringParams) -> dict[str, Any] | None:
    """The chat logprobs object: one content entry, with bytes as the UTF-8 of the decoded token."""
    if not params.report:
        return None

    def entry(score: TokenScore) -> dict[str, Any]:
        text = engine.token_text(score.token_id)
        return {"token": _key(engine, score, params), "logprob": score.logprob, "bytes": list(text.encode())}

    alternatives: dict[str, dict[str, Any]] = {}
    for score in result.top:
        if len(alternatives) == params.top_n:
            break
        item = entry(score)
        alternatives.setdefault(item["token"], item)
    return {"content": [{**entry(result.chosen), "top_logprobs": list(alternatives.values())}]}


def completion_body(shape: CompletionShape, engine: Engine, prompts: list[str | None], results: list[ScoreResult],
                    params: list[ScoringParams]) -> dict[str, Any]:
    texts = [p if p is not None else "".join(engine.token_text(t) for t in r.prompt_ids)
             for p, r in zip(prompts, results)]
    choices = [{"index": i, "text": completion_text(engine, r, p, texts[i]),
                "logprobs": completion_logprobs(engine, r, p, texts[i]), "finish_reason": "length"}
               for i, (r, p) in enumerate(zip(results, params))]
    generated = sum(p.next_token for p in params)
    return _envelope(shape, "text_completion", choices, results, generated)


def chat_body(shape: CompletionShape, engine: Engine, results: list[ScoreResult],
              params: list[ScoringParams]) -> dict[str, Any]:
    choices = [{"index": i, "message": {"role": "assistant", "content": engine.token_text(r.chosen.token_id)},
                "logprobs": chat_logprobs(engine, r, p), "finish_reason": "length"}
               for i, (r, p) in enumerate(zip(results, params))]
    return _envelope(shape, "chat.completion", choices, results, len(choices))


def _envelope(shape: CompletionShape, obj: str, choices: list[dict[str, Any]], results: list[ScoreResult],
              generated: int) -> dict[str, Any]:
    prompt_tokens = sum(r.prompt_tokens for r in results)
    return {"id": shape.id, "object": obj, "created": shape.created, "model": shape.model,
            "system_fingerprint": shape.fingerprint, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                      "total_tokens": prompt_tokens + generated}}

