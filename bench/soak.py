"""Soak: 64 concurrent clients against a real `millm serve` for 10 minutes, mixed traffic.

    python bench/soak.py [--minutes 10] [--clients 64] [--max-queue 128] [--port 8931]

Each client loops over streamed and plain chat, text completions, embeddings, next-token scoring and
steering changes through /api (values set, merged, cleared, steering toggled) on the bundled model with
its bundled L10 SAE attached. The server runs in a subprocess with a fresh MILLM_HOME (the operator's
steering is never touched), the usual model cache and MILLM_MAX_QUEUE from --max-queue (by default room
for every client, so the clients' work is served rather than mostly refused; a smaller queue soaks the
queue_full path instead).

Passes (exit 0) when: no answer is an error other than queue_full (503), every stream ends with
[DONE] and carries no error frame, and the server answers /api/health at the end. Prints requests per
kind, the server's RSS after warm-up and at the end, and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from served import millm_process

from millm.config import get_settings

MODEL = "SmolLM2-135M-Instruct"
SAE = "smollm2-135m-res-L10"
PROMPTS = ["Write one sentence about the sea.", "Name three colours.", "What is 2 + 2?", "Say hello in French."]
KINDS = ["stream", "stream", "stream", "chat", "chat", "completion", "embedding", "embedding", "score", "steer"]


def rss_mib(pid: int) -> float:
    """The process's resident set size, in MiB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@contextmanager
def serve(port: int, max_queue: int) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`millm serve` on loopback with a fresh home and the usual model cache; yields (base URL, process)."""
    home = tempfile.mkdtemp(prefix="millm-soak-")
    env = {"MILLM_HOME": home, "MILLM_CACHE": str(get_settings().cache_dir), "MILLM_MAX_QUEUE": str(max_queue)}
    with millm_process(port, env=env, log=Path(home) / "server.log") as served:
        yield served
    print(f"server log: {home}/server.log")


class Tally:
    """What the clients saw."""

    def __init__(self) -> None:
        self.done: collections.Counter[str] = collections.Counter()
        self.queue_full = 0
        self.errors: list[str] = []
        self.streams = 0

    def fail(self, kind: str, what: str) -> None:
        if len(self.errors) < 50:
            self.errors.append(f"{kind}: {what[:300]}")
        else:
            self.errors.append("...")


def body_of(kind: str, rng: random.Random) -> tuple[str, dict]:
    prompt = rng.choice(PROMPTS)
    messages = [{"role": "user", "content": prompt}]
    if kind in ("stream", "chat"):
        return "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": rng.randint(4, 16),
                                        "temperature": rng.choice([0, 0.7]), "stream": kind == "stream"}
    if kind == "completion":
        return "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": rng.randint(4, 12)}
    if kind == "embedding":
        return "/v1/embeddings", {"model": MODEL, "input": [prompt, prompt[::-1]]}
    return "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1, "logprobs": 5}


async def steer(client: httpx.AsyncClient, sae_id: str, rng: random.Random) -> httpx.Response:
    roll = rng.random()
    if roll < 0.4:
        return await client.patch("/api/steering", json={"sae": sae_id, "values": {
            str(rng.randrange(2048)): rng.choice([0.0, 4.0, -4.0, 8.0])}})
    if roll < 0.6:
        return await client.put("/api/steering", json={"sae": sae_id, "values": {str(rng.randrange(2048)): 6.0}})
    if roll < 0.75:
        return await client.delete("/api/steering")
    return await client.post("/api/steering/" + rng.choice(["enable", "disable"]))


async def one(client: httpx.AsyncClient, kind: str, sae_id: str, rng: random.Random, tally: Tally) -> None:
    if kind == "steer":
        r = await steer(client, sae_id, rng)
        if r.status_code != 200:
            tally.fail(kind, f"{r.status_code} {r.text}")
        return
    path, body = body_of(kind, rng)
    if kind == "stream":
        async with client.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return check_refusal(kind, r, tally)
            lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        tally.streams += 1
        if not lines or lines[-1] != "data: [DONE]":
            tally.fail(kind, f"stream did not end with [DONE]: {lines[-2:]}")
        if any('"error"' in line for line in lines):
            tally.fail(kind, f"error frame: {[line for line in lines if 'error' in line][:1]}")
        return
    r = await client.post(path, json=body)
    if r.status_code != 200:
        return check_refusal(kind, r, tally)
    json.loads(r.text)


def check_refusal(kind: str, r: httpx.Response, tally: Tally) -> None:
    try:
        code = r.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    if r.status_code == 503 and code == "queue_full":
        tally.queue_full += 1
        return
    tally.fail(kind, f"{r.status_code} {r.text}")


async def client_loop(base: str, index: int, until: float, sae_id: str, tally: Tally) -> None:
    rng = random.Random(index)
    async with httpx.AsyncClient(base_url=base, timeout=300) as client:
        while time.monotonic() < until:
            kind = rng.choice(KINDS)
            before = tally.queue_full
            try:
                await one(client, kind, sae_id, rng, tally)
            except httpx.HTTPError as exc:
                tally.fail(kind, f"{type(exc).__name__}: {exc}")
            tally.done[kind] += 1
            if tally.queue_full != before:
                await asyncio.sleep(rng.uniform(0.05, 0.3))  # back off as a client would


async def soak(base: str, proc: subprocess.Popen[bytes], minutes: float, clients: int) -> int:
    async with httpx.AsyncClient(base_url=base, timeout=60) as admin:
        saes = (await admin.get("/api/saes")).json()["data"]
        sae_id = next(s["id"] for s in saes if s["name"] == SAE)
        attached = await admin.post(f"/api/saes/{sae_id}/attach", json={})
        assert attached.status_code == 200, attached.text
    tally = Tally()
    start = time.monotonic()
    warm = min(60.0, minutes * 60 / 5)
    until = start + minutes * 60
    tasks = [asyncio.create_task(client_loop(base, i, until, sae_id, tally)) for i in range(clients)]
    await asyncio.sleep(warm)
    rss_warm = rss_mib(proc.pid)
    print(f"RSS after {warm:.0f} s warm-up: {rss_warm:8.1f} MiB")
    await asyncio.gather(*tasks)
    elapsed = time.monotonic() - start
    rss_end = rss_mib(proc.pid)
    print(f"RSS at the end:        {rss_end:8.1f} MiB   (end / warm-up {rss_end / rss_warm:.3f})")
    healthy = httpx.get(base + "/api/health", timeout=10).status_code == 200
    total = sum(tally.done.values())
    print(f"{clients} clients, {elapsed:.0f} s: {total} requests ({total / elapsed:.1f}/s); "
          + ", ".join(f"{k} {n}" for k, n in sorted(tally.done.items())))
    print(f"streams checked: {tally.streams}; queue_full refusals: {tally.queue_full}; health after: {healthy}")
    print(f"errors other than queue_full: {len(tally.errors)}")
    for line in tally.errors[:20]:
        print("  " + line)
    return 0 if healthy and not tally.errors else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--max-queue", type=int, default=128)
    parser.add_argument("--port", type=int, default=8931)
    args = parser.parse_args()
    with serve(args.port, args.max_queue) as (base, proc):
        code = asyncio.run(soak(base, proc, args.minutes, args.clients))
    sys.exit(code)


if __name__ == "__main__":
    main()
