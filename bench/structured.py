"""Structured output cost: constrained vs unconstrained decode, tool calls, streaming, and schema compile time.

    python bench/structured.py [--tokens 96] [--rounds 3]

Decode tokens/s (from the first token's text to the end: prefill, longer with the tool prompt, is not
counted) on the same prompt, in one run, interleaved round by round:
- free: no constraint;
- schema: a JSON schema that keeps the model writing (an array of at least 40 strings), whole body;
- schema, streamed: the same, rendered as SSE frames by the server's own renderer (millm.render.stream);
- tool call, streamed: a forced call of a tool whose arguments hold that array (tool_choice naming it),
  rendered as streamed delta.tool_calls;
then the first-use compile time of a 50-property schema and the time to get a matcher for it from the cache.
Each ratio is set against the free decode's median.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from millm.config import get_settings
from millm.engine import load_engine
from millm.engine.events import Delta, Event, Usage
from millm.engine.params import ChatPrompt, GenerationRequest
from millm.engine.templates import TOOLS_KWARG
from millm.engine.transformers_engine import TransformersEngine
from millm.registry import resolve
from millm.render.shapes import CompletionShape
from millm.render.stream import sse_events
from millm.requests.validation import sampling_params
from millm.structured.schema import check_response_format
from millm.structured.tools import tool_constraint

PROMPT = [{"role": "user", "content": "List as many animals as you can, as a JSON array of names."}]
ARRAY = {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 40}
LONG = {"type": "json_schema", "json_schema": {"name": "animals", "schema": ARRAY}}
TOOL = {"type": "function", "function": {"name": "record_animals", "description": "Record a list of animals",
                                         "parameters": {"type": "object", "properties": {"animals": ARRAY},
                                                        "required": ["animals"]}}}
WIDE = {"type": "json_schema", "json_schema": {"name": "wide", "schema": {
    "type": "object", "properties": {f"field_{i}": {"type": ["string", "integer"][i % 2]} for i in range(50)},
    "required": [f"field_{i}" for i in range(50)], "additionalProperties": False}}}


async def _frames(shape: CompletionShape, events: Iterator[Event]) -> int:
    async def source() -> AsyncIterator[Event]:
        for event in events:
            yield event

    return sum([1 async for _ in sse_events(shape, source(), 1)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    settings = get_settings()
    engine = load_engine(resolve(settings.default_model, settings), settings)
    assert isinstance(engine, TransformersEngine)
    params = sampling_params({"temperature": 0, "max_tokens": args.tokens})
    schema = check_response_format(LONG)
    call = tool_constraint([TOOL], {"type": "function", "function": {"name": "record_animals"}})
    assert call is not None

    def run(constraint: Any, stream: bool = False) -> tuple[float, float]:
        kwargs = {TOOLS_KWARG: call.prompt_tools()} if constraint is call else {}
        request = GenerationRequest([ChatPrompt(PROMPT, kwargs)], params, constraint=constraint)
        seen: list[Event] = []
        first: list[tuple[float, float]] = []  # when the first token's text came out: prefill is not decode

        def tee() -> Iterator[Event]:
            for event in engine.generate(request):
                if not first and isinstance(event, Delta):
                    first.append((time.perf_counter(), time.process_time()))
                seen.append(event)
                yield event

        if stream:
            shape = CompletionShape(chat=True, model=engine.model_id, fingerprint=engine.fingerprint,
                                    constraint=constraint)
            asyncio.run(_frames(shape, tee()))
        else:
            list(tee())
        usage = [e for e in seen if isinstance(e, Usage)][0]
        decoded = usage.completion_tokens - 1
        return decoded / (time.perf_counter() - first[0][0]), decoded / (time.process_time() - first[0][1])

    cases: dict[str, tuple[Any, bool]] = {"free": (None, False), "schema": (schema, False),
                                          "schema, streamed": (schema, True), "tool call, streamed": (call, True)}
    for constraint, stream in cases.values():  # warm up (and compile)
        run(constraint, stream)
    rates: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, (constraint, stream) in cases.items():
            rates[name].append(run(constraint, stream))
    wide = check_response_format(WIDE)
    assert wide is not None
    start = time.perf_counter()
    engine.constraints.matcher(wide)
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(100):
        engine.constraints.matcher(wide)
    cached = (time.perf_counter() - start) / 100
    free = [statistics.median(r[k] for r in rates["free"]) for k in (0, 1)]
    print(f"{engine.model_id}, up to {args.tokens} greedy tokens, medians of {args.rounds} interleaved rounds")
    print("(per wall second, and per CPU second of this process: the second holds on a machine shared with other "
          "work)")
    for name, values in rates.items():
        wall, cpu = (statistics.median(r[k] for r in values) for k in (0, 1))
        ratio = "" if name == "free" else f"   ratio {wall / free[0]:.3f} wall, {cpu / free[1]:.3f} CPU"
        print(f"{name + ':':21s}{wall:7.1f} tok/s {cpu:7.1f} tok/CPU-s{ratio}")
    print(f"50-property schema: first use {first * 1000:.1f} ms, cached reuse {cached * 1000:.3f} ms")


if __name__ == "__main__":
    main()
