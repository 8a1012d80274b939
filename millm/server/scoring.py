"""Scoring responses: OpenAI-shaped logprobs objects for completions and chat. Checking lives in the
request builder and running in the engine; this module only renders."""

from __future__ import annotations

from typing import Any

from millm.engine.base import Engine
from millm.engine.scoring import ScoreResult, ScoringParams, TokenScore
from millm.server.shapes import CompletionShape


def _key(engine: Engine, score: TokenScore, params: ScoringParams) -> str:
    return f"token_id:{score.token_id}" if params.token_ids_as_keys else engine.token_text(score.token_id)


def completion_logprobs(engine: Engine, result: ScoreResult, params: ScoringParams,
                        prompt: str) -> dict[str, Any] | None:
    """OpenAI's legacy logprobs object; texts that two ids share are one entry (the likelier)."""
    if not params.report:
        return None
    top: dict[str, float] = {}
    for score in result.top[:params.top_n]:
        top.setdefault(_key(engine, score, params), score.logprob)
    return {"tokens": [_key(engine, result.chosen, params)], "token_logprobs": [result.chosen.logprob],
            "top_logprobs": [top], "text_offset": [len(prompt)]}


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


def completion_body(shape: CompletionShape, engine: Engine, prompts: list[str], results: list[ScoreResult],
                    params: list[ScoringParams]) -> dict[str, Any]:
    choices = [{"index": i, "text": engine.token_text(r.chosen.token_id),
                "logprobs": completion_logprobs(engine, r, p, prompts[i]), "finish_reason": "length"}
               for i, (r, p) in enumerate(zip(results, params))]
    return _envelope(shape, "text_completion", choices, results)


def chat_body(shape: CompletionShape, engine: Engine, results: list[ScoreResult],
              params: list[ScoringParams]) -> dict[str, Any]:
    choices = [{"index": i, "message": {"role": "assistant", "content": engine.token_text(r.chosen.token_id)},
                "logprobs": chat_logprobs(engine, r, p), "finish_reason": "length"}
               for i, (r, p) in enumerate(zip(results, params))]
    return _envelope(shape, "chat.completion", choices, results)


def _envelope(shape: CompletionShape, obj: str, choices: list[dict[str, Any]],
              results: list[ScoreResult]) -> dict[str, Any]:
    prompt_tokens = sum(r.prompt_tokens for r in results)
    return {"id": shape.id, "object": obj, "created": shape.created, "model": shape.model,
            "system_fingerprint": shape.fingerprint, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(choices),
                      "total_tokens": prompt_tokens + len(choices)}}

