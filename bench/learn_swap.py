"""A learning job beside the server's other work: how long an unload and a model swap with a short graceful
timeout take while the job runs, and how long a chat sent meanwhile waits (issue 49, item 4).

    python bench/learn_swap.py [--examples 32] [--tokens 32] [--grace 3] [--port 8937]

Starts ``millm serve`` (the bundled model on transformers, MILLM_GRACEFUL_UNLOAD_TIMEOUT=--grace, a scratch
MILLM_HOME) and measures, in order:

1. ``alone``: a learn of ``--examples`` answers a side about "rain" (``--tokens`` each), nothing else running:
   seconds to succeed (what slicing the job costs, or saves).
2. ``chat``: the same learn again; once it has run ``--running`` seconds, a chat (16 tokens, greedy) is sent;
   once it is answered the job is cancelled (``DELETE /api/vectors/jobs/{id}``, where there is one).
3. ``unload``: as 2, and ``--swap-after`` seconds after the chat ``POST /api/models/{id}/unload``; then the
   model is loaded again.
4. ``swap``: as 3, with a swap to the bundled model on llama.cpp (``POST /api/models/{id}/load``) for the
   unload: its time includes the target's preflight (reading the GGUF header) and load.
Printed for 2 to 4: the chat's latency and status, the unload's or swap's time and status, how the job ended.

Run it from a checkout to measure that checkout's code (``python -m cli serve`` imports from the working
directory): ``git worktree add /tmp/before HEAD`` then ``cd /tmp/before && python /path/to/bench/learn_swap.py``
measures the code before a change with this script.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from served import millm_process  # noqa: E402

MODEL, GGUF = "SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct:Q4_1"
CHAT = {"model": MODEL, "max_tokens": 16, "temperature": 0, "messages": [{"role": "user", "content": "Hello!"}]}


def learn(base: str, name: str, examples: int, tokens: int) -> str:
    r = httpx.post(base + "/api/vectors/learn", timeout=60, json={
        "name": name, "concepts": ["rain"], "examples": examples, "tokens": tokens, "seed": 1})
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def job(base: str, job_id: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{base}/api/vectors/jobs/{job_id}", timeout=60).json()
    return body


def wait_end(base: str, job_id: str) -> dict[str, Any]:
    while (seen := job(base, job_id))["status"] in ("queued", "running"):
        time.sleep(0.1)
    return seen


def timed(method: str, url: str, out: dict[str, Any], **kwargs: Any) -> None:
    t0 = time.perf_counter()
    r = httpx.request(method, url, timeout=600, **kwargs)
    out.update(seconds=time.perf_counter() - t0, status=r.status_code,
               code=(r.json().get("error") or {}).get("code") if r.status_code >= 400 else None)


def shared(base: str, phase: str, url: str | None, args: argparse.Namespace) -> None:
    """Learn; ``args.running`` seconds in, send a chat and ``args.swap_after`` seconds later POST ``url`` (if
    any; else the job is cancelled once the chat is answered)."""
    job_id = learn(base, f"bench-{phase}", args.examples, args.tokens)
    while job(base, job_id)["status"] == "queued":
        time.sleep(0.05)
    time.sleep(args.running)  # well into writing the examples
    chat: dict[str, Any] = {}
    swap: dict[str, Any] = {}
    chatting = threading.Thread(target=timed, args=("POST", base + "/v1/chat/completions", chat),
                                kwargs={"json": CHAT})
    chatting.start()
    if url is not None:
        time.sleep(args.swap_after)
        timed("POST", url, swap, json={})
    chatting.join()
    if url is None:
        httpx.delete(f"{base}/api/vectors/jobs/{job_id}", timeout=60)  # 405 before DELETE existed: it runs on
    ended = wait_end(base, job_id)
    said = f"{phase} {swap['status']}{' ' + swap['code'] if swap['code'] else ''} in {swap['seconds']:.1f} s; " \
        if swap else ""
    print(f"{phase}: chat {chat['status']}{' ' + chat['code'] if chat['code'] else ''} after {chat['seconds']:.1f} s; "
          f"{said}the job {ended['status']}: {ended['progress']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=32, help="answers a side the learn writes")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per answer")
    parser.add_argument("--grace", type=float, default=3.0, help="MILLM_GRACEFUL_UNLOAD_TIMEOUT, seconds")
    parser.add_argument("--running", type=float, default=2.0, help="seconds the job runs before the chat is sent")
    parser.add_argument("--swap-after", type=float, default=0.3, help="seconds between the chat and the swap")
    parser.add_argument("--port", type=int, default=8937)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="millm-bench-learn-"))
    env = {"MILLM_HOME": str(home), "MILLM_GRACEFUL_UNLOAD_TIMEOUT": str(args.grace),
           "MILLM_CACHE": os.environ.get("MILLM_CACHE", str(Path(tempfile.gettempdir()) / "millm-test-cache"))}
    print(f"code: {Path.cwd()}; {args.examples} + {args.examples} answers of {args.tokens} tokens; graceful "
          f"timeout {args.grace:g} s")
    with millm_process(args.port, ["--model", MODEL], env=env, log=home / "serve.log") as (base, _):
        t0 = time.perf_counter()
        alone = wait_end(base, learn(base, "alone", args.examples, args.tokens))
        print(f"alone: the learn {alone['status']} in {time.perf_counter() - t0:.1f} s")

        shared(base, "chat", None, args)
        for phase, url in (("unload", f"{base}/api/models/{MODEL}/unload"), ("swap", f"{base}/api/models/{GGUF}/load")):
            shared(base, phase, url, args)
            if phase == "unload":
                httpx.post(f"{base}/api/models/{MODEL}/load", json={}, timeout=600).raise_for_status()
    return 0


if __name__ == "__main__":
    sys.exit(main())
