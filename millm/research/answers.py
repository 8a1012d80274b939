"""Sampled answers on the engine's request path: each a chat request (the model's template and end-of-turn
stops, ``SAMPLING``), prompt ``i`` seeded ``seed + i``, every answer of a call one engine job of plans decoded
as batched rows, each plan steered by its own values. Measures and the SAE training corpus sample here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from millm.engine.base import Engine, StepControl
from millm.engine.decode.driver import run
from millm.engine.events import Delta, Finish
from millm.engine.params import ChatPrompt, GenerationRequest, Json, SamplingParams
from millm.steering.core import RequestSteering
from millm.steering.scope import ALL, Scope

# the sampling fields of every sampled answer (a chat request's: temperature, top_p, vLLM's repetition_penalty)
SAMPLING = SamplingParams(temperature=0.8, top_p=0.95, repetition_penalty=1.15)
UNSTEERED = RequestSteering("unsteered", {})  # pins a plan unsteered, whatever the live values are
SEED_SPACE = 2**32  # the seeds a request takes


def chat_request(prompt: str, seed: int, max_tokens: int, steering: RequestSteering = UNSTEERED,
                 system: str | None = None, scope: Scope = ALL) -> GenerationRequest:
    """The chat request answering ``prompt`` (after a ``system`` message, if any; its steering applied where
    ``scope`` says): what a client sending these fields would get."""
    params = replace(SAMPLING, max_tokens=max_tokens, seed=seed % SEED_SPACE)
    messages: list[dict[str, Json]] = [{"role": "system", "content": system}] if system is not None else []
    messages.append({"role": "user", "content": prompt})
    return GenerationRequest([ChatPrompt(messages)], params, steering=steering, scope=scope)


def sample_answers(engine: Engine, prompts: Sequence[str], seed: int, max_tokens: int,
                   steerings: Sequence[RequestSteering] = (UNSTEERED,), system: str | None = None,
                   scope: Scope = ALL, finished: Callable[[int], None] = lambda _: None,
                   control: StepControl | None = None) -> list[list[str]]:
    """Each steering's answers to every prompt (prompt ``i`` seeded ``seed + i`` under every steering, so two
    steerings differ by their values, not their draw): one engine job, decoded as batched rows.
    ``finished(n)`` hears each time an answer ends, ``n`` of them so far (a progress display); ``control``, if
    given, is checked between decode steps (its commands run there, and cancelling it ends the job)."""
    plans = [engine.prepare(chat_request(p, seed + i, max_tokens, o, system, scope)) for o in steerings
             for i, p in enumerate(prompts)]
    texts, ended = [""] * len(plans), 0
    for event in run(engine, plans, control):  # the decode loop's driver: its failures typed as everywhere
        if isinstance(event, Delta):
            texts[event.index] += event.text
        elif isinstance(event, Finish):
            ended += 1
            finished(ended)
    per = len(prompts)
    return [texts[k * per:(k + 1) * per] for k in range(len(steerings))]
