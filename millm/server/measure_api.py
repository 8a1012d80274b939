"""The sweep measure's parts for any answers (``POST /api/measure``): each answer's prompt-free fluency (its mean
token log-probability under the unsteered model after an empty user turn, the engine's scoring path) and its
share of distinct word bigrams, as ``millm.research.measure`` computes them for a sweep. The console's comparison
shows them under each answer."""

from __future__ import annotations

from typing import Any

from quart import Blueprint

from millm.errors import InvalidParameter, ModelNotLoaded
from millm.research.measure import Measure, bigram_share, check_engine
from millm.server.api import body, use_names
from millm.server.state import services

bp = Blueprint("measure_api", __name__, url_prefix="/api/measure")
use_names(bp)

MOST, CHARS = 64, 16384  # answers one request measures, characters each


@bp.post("")
async def measure_answers() -> Any:
    """Measure answers: {"answers": [text, ...]} -> {"data": [{"logprob", "tokens", "bigrams"}]}: per answer its
    mean token log-probability with no prompt before it (nats/token, unsteered, every SAE suppressed), its token
    count and its distinct-bigram share. 1 to 64 answers of at most 16384 characters; a model that cannot score
    (llama.cpp) is a 400, no model a 503."""
    answers = (await body())["answers"]
    if not 1 <= len(answers) <= MOST or any(len(a) > CHARS for a in answers):
        raise InvalidParameter(f"'answers' takes 1 to {MOST} texts of at most {CHARS} characters.", param="answers")
    svc = services()
    svc.manager.check_not_busy()
    engine = svc.manager.engine
    if engine is None:
        raise ModelNotLoaded("No model is loaded; load a transformers model to measure answers.")
    check_engine(engine)
    scored = await svc.worker.call(lambda: Measure(engine, ("",)).logprobs(answers, prompted=False))
    return {"data": [{"logprob": round(total / count, 4) if count else None, "tokens": count,
                      "bigrams": round(bigram_share(answer), 4)}
                     for answer, (total, count) in zip(answers, scored, strict=True)]}
