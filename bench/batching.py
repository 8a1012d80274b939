"""Continuous batching on vs off (serial), over HTTP, the bundled model, one run.

    python bench/batching.py [--clients 16] [--tokens 64]

One process loads the model once and serves it on two loopback ports, MILLM_BATCHING off and on,
which take turns (each scenario runs off, then on; the one-client case alternates a few rounds).
Prints aggregate tokens/s of 16 concurrent streaming clients (64 greedy tokens each), their p95
time to first token, the same clients split over 4 profiles x 3 temperatures, one client alone,
and the ratios on/off; then the peak RSS of this process (which held 16 batched rows). The store
lives in a temporary MILLM_HOME; the dequantised weights come from the usual cache.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if "MILLM_HOME" not in os.environ:
    from platformdirs import user_data_dir

    os.environ.setdefault("MILLM_CACHE", str(Path(user_data_dir("millm")) / "cache"))
    os.environ["MILLM_HOME"] = tempfile.mkdtemp(prefix="millm-bench-")

import httpx  # noqa: E402

from millm.config import get_settings  # noqa: E402
from millm.engine import load_engine  # noqa: E402
from millm.registry import resolve  # noqa: E402
from millm.sae.bundled import bundled_saes  # noqa: E402
from millm.server.app import create_app  # noqa: E402
from millm.server.run import in_thread  # noqa: E402

PROMPTS = ["Tell me a long story about a village by the sea.", "Explain the history of the printing press.",
           "Write a long letter to a friend about your summer.", "Describe life on Earth in the year 2300."]
TEMPERATURES = (0.0, 0.7, 1.0)


def stream(http: httpx.Client, base: str, body: dict[str, Any]) -> tuple[float, float, int]:
    """One streamed chat completion: (time to first token, total time, completion tokens)."""
    start = time.perf_counter()
    first, tokens = None, 0
    with http.stream("POST", base + "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                first = first or time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    total = time.perf_counter() - start
    return first or total, total, tokens


def clients(base: str, bodies: list[dict[str, Any]]) -> tuple[float, float]:
    """Every body at once, one client each: aggregate tokens/s and p95 time to first token."""
    with httpx.Client(timeout=1200, limits=httpx.Limits(max_connections=64)) as http, \
            ThreadPoolExecutor(len(bodies)) as pool:
        start = time.perf_counter()
        results = list(pool.map(lambda b: stream(http, base, b), bodies))
        wall = time.perf_counter() - start
    firsts = sorted(r[0] for r in results)
    p95 = firsts[min(len(firsts) - 1, round(0.95 * (len(firsts) - 1)))]
    return sum(r[2] for r in results) / wall, p95


def make_profiles(base: str, count: int) -> list[str]:
    """``count`` profiles on the bundled layer-10 SAE, each steering a different labelled feature."""
    sae = next(s for s in bundled_saes() if s.layer == 10)
    r = httpx.post(base + "/api/saes", json={"path": str(sae.path)}, timeout=60)
    sae_id = r.json()["id"]
    httpx.post(base + f"/api/saes/{sae_id}/attach", json={}, timeout=60).raise_for_status()
    names = []
    for i in range(count):
        name = f"bench-{i}"
        entries = [{"sae": sae_id, "feature": 10 + 37 * i, "strength": 4.0 + i}]
        httpx.post(base + "/api/profiles", json={"name": name, "entries": entries}, timeout=60)
        names.append(name)
    return names


def bodies(model: str, n: int, tokens: int, profiles: list[str]) -> dict[str, list[dict[str, Any]]]:
    greedy = [{"model": model, "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
               "max_tokens": tokens, "temperature": 0, "stream_options": {"include_usage": True}} for i in range(n)]
    mixed = [{**b, "profile": profiles[i % len(profiles)], "temperature": TEMPERATURES[i % len(TEMPERATURES)]}
             for i, b in enumerate(greedy)]
    return {"greedy": greedy, "mixed": mixed, "alone": greedy[:1]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="Alternating rounds of the one-client case.")
    args = parser.parse_args()
    settings = get_settings()
    engine = load_engine(resolve(settings.default_model, settings), settings)
    results: dict[bool, dict[str, tuple[float, float]]] = {False: {}, True: {}}
    serial = settings.model_copy(update={"max_queue": max(32, 2 * args.clients)})
    batched = serial.model_copy(update={"batching": True, "batch_max_rows": max(16, args.clients)})
    # both servers share the one model and take turns (never at once), so the machine's load is alike for both
    with in_thread(create_app(serial, engine)) as off, in_thread(create_app(batched, engine)) as on:
        profiles = make_profiles(off, 4)
        work = bodies(engine.model_id, args.clients, args.tokens, profiles)
        for base in (off, on):
            stream(httpx.Client(timeout=600), base, work["greedy"][0])  # warm up
        for key in ("greedy", "mixed"):
            for batching, base in ((False, off), (True, on)):
                results[batching][key] = clients(base, work[key])
        alone: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(args.rounds):
            for batching, base in ((False, off), (True, on)):
                alone[batching].append(clients(base, work["alone"]))
        for batching in (False, True):
            tps, ttft = zip(*alone[batching])
            results[batching]["alone"] = (statistics.median(tps), statistics.median(ttft))
        health = httpx.get(on + "/api/health/inference", timeout=10).json()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    serial_r, batch_r = results[False], results[True]
    print(f"{engine.fingerprint}, {args.clients} streaming clients x "
          f"{args.tokens} tokens, torch threads {__import__('torch').get_num_threads()}")
    for key, label in (("greedy", f"{args.clients} clients, greedy"),
                       ("mixed", f"{args.clients} clients, 4 profiles x 3 temperatures"),
                       ("alone", f"1 client alone (median of {args.rounds})")):
        (s_tps, s_ttft), (b_tps, b_ttft) = serial_r[key], batch_r[key]
        print(f"{label:42s} serial {s_tps:7.1f} tok/s p95 TTFT {s_ttft:6.2f} s | batching {b_tps:7.1f} tok/s "
              f"p95 TTFT {b_ttft:6.2f} s | ratio {b_tps / s_tps:5.2f}x")
    print(f"peak RSS of this process (model + 16 batched rows): {peak:.0f} MiB")
    print("batch counters:", json.dumps(health.get("batch", {})))


if __name__ == "__main__":
    main()
