"""Memory under a client that sends a new schema with every request: the compiled-constraint cache bounded
(miLLM) against the unbounded dict it was before, each in a process of its own, same requests.

    python bench/caches.py [--requests 300] [--properties 8]

Each request is a one-token chat completion constrained by a JSON Schema no request before it used (its
property names are new), run through the engine's scheduler as the server runs it. Prints the RSS growth
of each process every 100 requests and the ratio at the end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def measure(requests: int, properties: int, bounded: bool) -> list[tuple[int, float, int]]:
    """(requests so far, RSS growth in MB, compiled constraints kept) every 100 requests."""
    import psutil

    from millm.config import get_settings
    from millm.engine import load_engine
    from millm.engine.params import ChatPrompt, GenerationRequest
    from millm.registry import resolve
    from millm.requests.validation import sampling_params
    from millm.structured.schema import JsonConstraint

    settings = get_settings()
    engine = load_engine(resolve(settings.default_model, settings), settings)
    cache = engine.constraints._compiled
    if not bounded:  # what the cache was before: a dict that kept every schema
        cache.max_entries, cache.max_bytes = 10**12, 10**15
    params = sampling_params({"temperature": 0, "max_tokens": 1})
    prompt = [ChatPrompt([{"role": "user", "content": "Describe a cat as JSON."}])]

    def one(i: int) -> None:
        schema = {"type": "object", "properties": {f"field_{i}_{j}": {"type": "string", "maxLength": 24}
                                                   for j in range(properties)},
                  "required": [f"field_{i}_0"], "additionalProperties": False}
        list(engine.generate(GenerationRequest(prompt, params, constraint=JsonConstraint("json_schema", schema, "x"))))

    one(-1)  # the first compile allocates the tokenizer's tables: not what is measured
    process = psutil.Process()
    start = process.memory_info().rss
    out = []
    for i in range(requests):
        one(i)
        if (i + 1) % 100 == 0 or i + 1 == requests:
            out.append((i + 1, (process.memory_info().rss - start) / 2**20, len(cache)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--properties", type=int, default=8)
    parser.add_argument("--mode", choices=("bounded", "unbounded"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode is not None:
        print(json.dumps(measure(args.requests, args.properties, args.mode == "bounded")))
        return
    results = {}
    for mode in ("unbounded", "bounded"):
        done = subprocess.run([sys.executable, __file__, "--mode", mode, "--requests", str(args.requests),
                               "--properties", str(args.properties)], capture_output=True, text=True, check=True)
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        for n, grown, kept in results[mode]:
            print(f"{mode:9}  {n:4} requests  RSS +{grown:6.1f} MB  compiled constraints kept: {kept}")
    before, after = results["unbounded"][-1][1], results["bounded"][-1][1]
    print(f"RSS growth over {args.requests} distinct schemas: before {before:.1f} MB, after {after:.1f} MB "
          f"({after / before:.2f}x)" if before > 0 else "no growth measured")


if __name__ == "__main__":
    main()
