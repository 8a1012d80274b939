"""Structured output cost: constrained vs unconstrained decode, and schema compile time.

    python bench/structured.py [--tokens 96] [--rounds 3]

Decode tokens/s on the same prompt with and without a JSON schema that keeps the model writing (an
array of at least 40 strings), then the first-use compile time of a 50-property schema and the
time to get a matcher for it again from the cache.
"""

from __future__ import annotations

import argparse
import statistics
import time

from millm.config import get_settings
from millm.engine import load_engine
from millm.engine.events import Usage
from millm.engine.params import ChatPrompt, GenerationRequest
from millm.registry import resolve
from millm.structured.schema import check_response_format
from millm.validation import sampling_params

PROMPT = [{"role": "user", "content": "List as many animals as you can, as a JSON array of names."}]
LONG = {"type": "json_schema", "json_schema": {"name": "animals", "schema": {
    "type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 40}}}
WIDE = {"type": "json_schema", "json_schema": {"name": "wide", "schema": {
    "type": "object", "properties": {f"field_{i}": {"type": ["string", "integer"][i % 2]} for i in range(50)},
    "required": [f"field_{i}" for i in range(50)], "additionalProperties": False}}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    settings = get_settings()
    engine = load_engine(resolve(settings.default_model, settings), settings)
    params = sampling_params({"temperature": 0, "max_tokens": args.tokens})
    constraint = check_response_format(LONG)

    def run(c: object) -> float:
        start = time.perf_counter()
        usage = [e for e in engine.generate(GenerationRequest([ChatPrompt(PROMPT)], params, constraint=c))
                 if isinstance(e, Usage)][0]
        return usage.completion_tokens / (time.perf_counter() - start)

    run(None), run(constraint)  # warm up (and compile)
    free, bound = [], []
    for _ in range(args.rounds):
        free.append(run(None))
        bound.append(run(constraint))
    f, b = statistics.median(free), statistics.median(bound)
    wide = check_response_format(WIDE)
    start = time.perf_counter()
    engine.constraints.matcher(wide)
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(100):
        engine.constraints.matcher(wide)
    cached = (time.perf_counter() - start) / 100
    print(f"{engine.model_id}, up to {args.tokens} greedy tokens, medians of {args.rounds} rounds")
    print(f"unconstrained: {f:7.1f} tok/s")
    print(f"constrained:   {b:7.1f} tok/s   ratio {b / f:.3f}")
    print(f"50-property schema: first use {first * 1000:.1f} ms, cached reuse {cached * 1000:.3f} ms")


if __name__ == "__main__":
    main()
