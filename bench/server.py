"""The same greedy request in-process vs through the HTTP server (streaming), then 16 concurrent clients.

    python bench/server.py [--tokens 64] [--rounds 3] [--clients 16] [--model SmolLM2-135M-Instruct:Q4_1]

``--model`` picks the model both sides load (default: the settings' default, on transformers; a ``:QUANT`` id
runs on llama.cpp).

Starts `millm serve` as a subprocess on a loopback port (the model loads from MILLM_HOME's cache),
measures the engine in this process, and prints tokens/s, time to first token and their ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from served import millm_server

from millm.config import get_settings
from millm.engine import load_engine
from millm.engine.events import Delta
from millm.engine.params import GenerationRequest, TextPrompt
from millm.registry import resolve
from millm.requests.validation import sampling_params

PROMPT = "Once upon a time, in a village by the sea, there lived"


def in_process(engine, tokens: int) -> tuple[float, float, str]:
    request = GenerationRequest([TextPrompt(PROMPT)], sampling_params({"temperature": 0, "max_tokens": tokens}))
    start = time.perf_counter()
    first, _n, text = None, 0, []
    for event in engine.generate(request):
        if isinstance(event, Delta):
            first = first or time.perf_counter() - start
            text.append(event.text)
    elapsed = time.perf_counter() - start
    return first or elapsed, elapsed, "".join(text)


_http = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=64))


def over_http(base: str, model: str, tokens: int) -> tuple[float, float, str, int]:
    """One streamed request on a kept-alive connection, as SDK clients make them."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "stream": True}
    start = time.perf_counter()
    first, text, completion = None, [], 0
    with _http.stream("POST", base + "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["text"]:
                first = first or time.perf_counter() - start
                text.append(chunk["choices"][0]["text"])
            if "usage" in chunk:
                completion = chunk["usage"]["completion_tokens"]
    elapsed = time.perf_counter() - start
    return first or elapsed, elapsed, "".join(text), completion


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--model", default=None, help="the model id (default: the settings' default model)")
    args = parser.parse_args()

    settings = get_settings()
    engine = load_engine(resolve(args.model or settings.default_model, settings), settings)
    with millm_server(args.port, args.model) as base:
        in_process(engine, args.tokens), over_http(base, engine.model_id, args.tokens)  # warm up
        local, remote, reference = [], [], None
        for _ in range(args.rounds):
            ttft, total, text = in_process(engine, args.tokens)
            local.append((ttft, args.tokens / total))
            reference = text
            ttft, total, text, n = over_http(base, engine.model_id, args.tokens)
            assert text == reference, "HTTP text differs from in-process text"
            remote.append((ttft, n / total))
        l_ttft, l_tps = (statistics.median(x) for x in zip(*local))
        r_ttft, r_tps = (statistics.median(x) for x in zip(*remote))
        print(f"{engine.model_id}, {args.tokens} greedy tokens, medians of {args.rounds} rounds")
        print(f"in-process:      {l_tps:7.1f} tok/s   first token {l_ttft * 1000:7.1f} ms")
        print(f"HTTP streaming:  {r_tps:7.1f} tok/s   first token {r_ttft * 1000:7.1f} ms")
        print(f"ratio HTTP/in-process tok/s: {r_tps / l_tps:.3f}   added time to first token: "
              f"{(r_ttft - l_ttft) * 1000:.1f} ms")

        with ThreadPoolExecutor(args.clients) as pool:
            start = time.perf_counter()
            results = list(pool.map(lambda _: over_http(base, engine.model_id, args.tokens), range(args.clients)))
            wall = time.perf_counter() - start
        correct = sum(text == reference for _, _, text, _ in results)
        latencies = sorted(total for _, total, _, _ in results)
        p95 = latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))]
        print(f"{args.clients} concurrent clients: {correct}/{args.clients} correct bodies, "
              f"p50 {statistics.median(latencies):.2f} s, p95 {p95:.2f} s, "
              f"{sum(n for *_, n in results) / wall:.1f} tok/s overall")


if __name__ == "__main__":
    main()
