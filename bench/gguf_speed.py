"""GGUF decode speed: miLLM's llama.cpp engine vs raw llama-cpp-python, and through HTTP streaming.

    python bench/gguf_speed.py [--tokens 128] [--rounds 3]

(Not named gguf.py: run as a script from bench/, that name would shadow the gguf package
that transformers imports to read GGUF files, breaking every other benchmark's first load.)

Same model file, prompt and settings (greedy, no repeat penalty) for all three; prints tokens/s and
the ratios miLLM/raw and HTTP/raw.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx
from served import millm_server

from millm.config import get_settings
from millm.engine import load_engine
from millm.engine.events import Usage
from millm.engine.params import ChatPrompt, GenerationRequest
from millm.registry import resolve
from millm.requests.validation import sampling_params

MODEL = "SmolLM2-135M-Instruct:Q4_1"
MESSAGES = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--port", type=int, default=8766)
    args = parser.parse_args()
    settings = get_settings()
    engine = load_engine(resolve(MODEL, settings), settings)
    request = GenerationRequest([ChatPrompt(MESSAGES)], sampling_params({"temperature": 0, "max_tokens": args.tokens}))

    def ours() -> float:
        start = time.perf_counter()
        usage = [e for e in engine.generate(request) if isinstance(e, Usage)][0]
        return usage.completion_tokens / (time.perf_counter() - start)

    def raw() -> float:
        start = time.perf_counter()
        out = engine.llm.create_chat_completion(messages=MESSAGES, max_tokens=args.tokens, temperature=0.0,
                                                top_p=1.0, top_k=0, min_p=0.0, repeat_penalty=1.0)
        return out["usage"]["completion_tokens"] / (time.perf_counter() - start)

    client = httpx.Client(timeout=600)

    def http(base: str) -> float:
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": args.tokens, "temperature": 0, "stream": True}
        start, n = time.perf_counter(), 0
        with client.stream("POST", base + "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and "usage" in line:
                    n = json.loads(line[6:])["usage"]["completion_tokens"]
        return n / (time.perf_counter() - start)

    with millm_server(args.port, MODEL) as base:
        ours(), raw(), http(base)  # warm up
        results: dict[str, list[float]] = {"raw": [], "ours": [], "http": []}
        for _ in range(args.rounds):
            results["raw"].append(raw())
            results["ours"].append(ours())
            results["http"].append(http(base))
    m = {k: statistics.median(v) for k, v in results.items()}
    print(f"{MODEL}, up to {args.tokens} greedy tokens, medians of {args.rounds} rounds")
    print(f"raw llama-cpp-python create_chat_completion: {m['raw']:7.1f} tok/s")
    print(f"miLLM llama.cpp engine:                      {m['ours']:7.1f} tok/s   ratio {m['ours'] / m['raw']:.3f}")
    print(f"miLLM through HTTP streaming:                {m['http']:7.1f} tok/s   ratio {m['http'] / m['raw']:.3f}")


if __name__ == "__main__":
    main()
