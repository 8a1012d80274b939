"""A 4-way comparison (the console's Compare page) against the same four requests one after another, on
``millm serve --batching``: wall time of each, and their ratio, in one run on one server.

    python bench/compare.py [--tokens 48] [--rounds 1]

The four conditions are the page's: off, live, and two strengths of the bundled L10 SAE's music feature (as the
profiles the page saves); one prompt, one seed, streamed as the page streams them (at once), then the same four
bodies sent one at a time. Each answer is checked equal across the two ways (same seed, same text).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time
from typing import Any

import httpx

from bench.served import millm_process

SAE, MUSIC = "smollm2-135m-res-L10", 2375
EXTRAS = [{"steering_intensity": "off"}, {}, {"profile": "cmp.bench.40"}, {"profile": "cmp.bench.-40"}]


async def answer(client: httpx.AsyncClient, body: dict[str, Any]) -> str:
    text = ""
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:]).get("choices", []):
                    text += (choice.get("delta") or {}).get("content") or ""
    return text


async def measure(base: str, tokens: int) -> tuple[float, float, bool]:
    model = httpx.get(base + "/api/health/inference").json()["model"]
    httpx.post(f"{base}/api/saes/{SAE}/attach", json={}, timeout=120).raise_for_status()
    for strength in (40, -40):
        doc = {"name": f"cmp.bench.{strength}", "entries": [{"sae": SAE, "feature": MUSIC, "strength": strength}]}
        httpx.post(base + "/api/profiles/import?overwrite=true", json=doc, timeout=60).raise_for_status()
    bodies = [{"model": model, "messages": [{"role": "user", "content": "Tell me about your day."}], "seed": 7,
               "temperature": 0.7, "max_tokens": tokens, "stream": True, **extra} for extra in EXTRAS]
    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        await answer(client, bodies[1])  # warm
        began = time.perf_counter()
        together = await asyncio.gather(*(answer(client, b) for b in bodies))
        at_once = time.perf_counter() - began
        began = time.perf_counter()
        alone = [await answer(client, b) for b in bodies]
        in_turn = time.perf_counter() - began
    return at_once, in_turn, together == alone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with millm_process(port, ["--batching"]) as (base, _):
        at_once, in_turn, same = asyncio.run(measure(base, args.tokens))
    print(f"4-way comparison at once: {at_once:.2f} s; the four one after another: {in_turn:.2f} s; "
          f"ratio {in_turn / at_once:.2f}x; same texts both ways: {same}")


if __name__ == "__main__":
    main()
