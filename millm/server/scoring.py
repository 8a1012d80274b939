"""Scoring requests on /v1/completions and /v1/chat/completions: checking, running, OpenAI-shaped logprobs."""

from __future__ import annotations

from typing import Any

from millm.engine import TransformersEngine
from millm.engine.params import ChatPrompt
from millm.engine.scoring import (ScoreResult, ScoringParams, TokenScore, check_allowed, check_scoring_shape,
                                  check_temperature, check_top_n, score_row)
from millm.engine.templates import has_chat_template
from millm.errors import FieldNotHonoured, InvalidParameter, MillmError, NoChatTemplate
from millm.fields import is_no_change
from millm.server.shapes import CompletionShape
from millm.validation import check_number, max_tokens_of

# fields that mean nothing to one forward pass: reported as unused
SCORING_UNUSED = ("top_p", "stop", "frequency_penalty", "presence_penalty")
# fields a scoring request refuses: scoring is never steered, constrained or read out
SCORING_REFUSED = ("profile", "steering_intensity", "steering", "response_format", "return_sae_activations")


def is_completion_scoring(body: dict[str, Any]) -> bool:
    return not is_no_change("logprobs", body.get("logprobs")) or body.get("allowed_token_ids") is not None


def is_chat_scoring(body: dict[str, Any]) -> bool:
    """logprobs true or allowed_token_ids; top_logprobs alone comes here too, to be refused."""
    return (body.get("logprobs") is True or body.get("allowed_token_ids") is not None
            or body.get("top_logprobs") is not None)


def check_request(body: dict[str, Any]) -> None:
    """What a scoring request refuses before any model is loaded."""
    max_tokens_of(body)
    check_scoring_shape(body)
    for name in SCORING_REFUSED:
        if not is_no_change(name, body.get(name)):
            raise FieldNotHonoured(f"'{name}' cannot apply to a scoring request: scoring is never steered, "
                                   "constrained or read out.", param=name)
    if body.get("temperature") is not None:
        check_number("temperature", body["temperature"])
    check_temperature(body.get("temperature"))


def _common(body: dict[str, Any], vocab_size: int) -> tuple[tuple[int, ...] | None, float]:
    check_request(body)
    allowed = None
    if body.get("allowed_token_ids") is not None:
        allowed = check_allowed(body["allowed_token_ids"], vocab_size)
    return allowed, check_temperature(body.get("temperature"))


def _as_ids(body: dict[str, Any]) -> bool:
    value = body.get("return_tokens_as_token_ids")
    if value is not None and not isinstance(value, bool):
        raise InvalidParameter("'return_tokens_as_token_ids' must be true or false.", param="return_tokens_as_token_ids")
    return bool(value)


def completion_params(body: dict[str, Any], vocab_size: int) -> ScoringParams:
    """Scoring on /v1/completions: logprobs 0-20 and/or allowed_token_ids; every allowed token is returned."""
    allowed, temperature = _common(body, vocab_size)
    logprobs = None if is_no_change("logprobs", body.get("logprobs")) else check_top_n("logprobs", body["logprobs"])
    top_n = logprobs or 0
    if allowed is not None and logprobs is not None:
        top_n = len(allowed)
    return ScoringParams(allowed, temperature, top_n, logprobs is not None, _as_ids(body))


def chat_params(body: dict[str, Any], vocab_size: int) -> ScoringParams:
    """Scoring on /v1/chat/completions: logprobs true, top_logprobs 0-20, allowed_token_ids."""
    logprobs, top = body.get("logprobs"), body.get("top_logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise InvalidParameter("'logprobs' must be true or false on chat completions.", param="logprobs")
    if top is not None and logprobs is not True:
        raise InvalidParameter("'top_logprobs' needs logprobs: true.", param="top_logprobs")
    allowed, temperature = _common(body, vocab_size)
    top_n = check_top_n("top_logprobs", top) if top is not None else 0
    return ScoringParams(allowed, temperature, top_n, logprobs is True, _as_ids(body))


def unused(body: dict[str, Any]) -> list[str]:
    return [name for name in SCORING_UNUSED if not is_no_change(name, body.get(name))]


def chat_prompt_ids(engine: TransformersEngine, conversations: list[Any]) -> list[list[int]]:
    """Render each conversation with the generation prompt; no special tokens are added again."""
    if not has_chat_template(engine.tokenizer):
        raise NoChatTemplate(f"'{engine.model_id}' has no chat template, so chat scoring would score a prompt it "
                             "was never trained on; use /v1/completions with the prompt you mean.")
    return [engine.tokenize(ChatPrompt(messages)) for messages in conversations]


def score_each(engine: TransformersEngine, prompt_ids: list[list[int]], params: ScoringParams) -> list[ScoreResult]:
    """Chat with extra_messages: one conversation at a time; a failure names its conversation."""
    results = []
    for k, ids in enumerate(prompt_ids):
        try:
            results.append(score_row(engine.next_token_logits([ids])[0], params))
        except MillmError as exc:
            where = "messages" if k == 0 else f"extra_messages[{k - 1}]"
            exc.message, exc.param = f"Conversation {k} ({where}): {exc.message}", where
            exc.args = (exc.message,)
            raise
    return results


def score_batch(engine: TransformersEngine, prompt_ids: list[list[int]], params: ScoringParams,
                batch_size: int = 32) -> list[ScoreResult]:
    """Prompts scored in padded batches (same numbers as one at a time, to float tolerance)."""
    logits = engine.next_token_logits(prompt_ids, batch_size)
    return [score_row(row, params) for row in logits]


def _key(engine: TransformersEngine, score: TokenScore, params: ScoringParams) -> str:
    return f"token_id:{score.token_id}" if params.token_ids_as_keys else engine.tokenizer.decode([score.token_id])


def completion_logprobs(engine: TransformersEngine, result: ScoreResult, params: ScoringParams,
                        prompt: str) -> dict[str, Any] | None:
    """OpenAI's legacy logprobs object; texts that two ids share are one entry (the likelier)."""
    if not params.report:
        return None
    top: dict[str, float] = {}
    for score in result.top[:params.top_n]:
        top.setdefault(_key(engine, score, params), score.logprob)
    return {"tokens": [_key(engine, result.chosen, params)], "token_logprobs": [result.chosen.logprob],
            "top_logprobs": [top], "text_offset": [len(prompt)]}


def chat_logprobs(engine: TransformersEngine, result: ScoreResult, params: ScoringParams) -> dict[str, Any] | None:
    """The chat logprobs object: one content entry, with bytes as the UTF-8 of the decoded token."""
    if not params.report:
        return None

    def entry(score: TokenScore) -> dict[str, Any]:
        text = engine.tokenizer.decode([score.token_id])
        return {"token": _key(engine, score, params), "logprob": score.logprob, "bytes": list(text.encode())}

    alternatives: dict[str, dict[str, Any]] = {}
    for score in result.top:
        if len(alternatives) == params.top_n:
            break
        item = entry(score)
        alternatives.setdefault(item["token"], item)
    return {"content": [{**entry(result.chosen), "top_logprobs": list(alternatives.values())}]}


def completion_body(shape: CompletionShape, engine: TransformersEngine, prompts: list[str],
                    prompt_ids: list[list[int]], results: list[ScoreResult], params: ScoringParams) -> dict[str, Any]:
    choices = [{"index": i, "text": engine.tokenizer.decode([r.chosen.token_id]),
                "logprobs": completion_logprobs(engine, r, params, prompts[i]), "finish_reason": "length"}
               for i, r in enumerate(results)]
    return _envelope(shape, "text_completion", choices, prompt_ids)


def chat_body(shape: CompletionShape, engine: TransformersEngine, prompt_ids: list[list[int]],
              results: list[ScoreResult], params: ScoringParams) -> dict[str, Any]:
    choices = [{"index": i, "message": {"role": "assistant", "content": engine.tokenizer.decode([r.chosen.token_id])},
                "logprobs": chat_logprobs(engine, r, params), "finish_reason": "length"}
               for i, r in enumerate(results)]
    return _envelope(shape, "chat.completion", choices, prompt_ids)


def _envelope(shape: CompletionShape, obj: str, choices: list[dict[str, Any]],
              prompt_ids: list[list[int]]) -> dict[str, Any]:
    prompt_tokens = sum(len(ids) for ids in prompt_ids)
    return {"id": shape.id, "object": obj, "created": shape.created, "model": shape.model,
            "system_fingerprint": shape.fingerprint, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(choices),
                      "total_tokens": prompt_tokens + len(choices)}}

