"""``millm batch`` throughput: rows/s against the same rows sent one by one to ``millm serve``, and over
Ray with one worker against no Ray; prints the per-worker rate and the expected cluster throughput.

    python bench/batch.py --rows 32 --max-tokens 8 --batch-size 16 [--no-ray] [--no-served]

Targets (issue 18): batch >= 3x one-by-one at batch 16 for short chats; Ray with one worker >= 0.8x
without Ray. Rows are short greedy chats; every run answers the same file.

What is timed, so that model load counts on neither side: the local rate is measured after its engine is
loaded and warmed; the Ray rate is marginal: on one Ray instance, after a warm-up job of one batch (the
instance's one-time costs: its first worker processes, Ray Data's helper actors), a job of all rows minus
a job of its first batch. Both pay one actor start and one engine load, which cancel. What a job pays
before its first row (actor start, engine load) is printed on its own. The Ray jobs run between two local
passes over the same rows, and Ray's rate is set against their mean: load from other work that comes or
goes during the run shows as a gap between the two passes instead of silently moving the ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.served import millm_server  # noqa: E402

TOPICS = ["the sea", "a cat", "rain", "bread", "the moon", "music", "a train", "snow", "coffee", "a garden",
          "the wind", "a river", "paper", "a bridge", "light", "a song"]


def rows(count: int, max_tokens: int, model: str) -> list[dict]:
    def body(i: int) -> dict:
        return {"model": model, "messages": [{"role": "user", "content": f"One sentence about {TOPICS[i % 16]}."}],
                "temperature": 0, "max_tokens": max_tokens}

    return [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body(i)}
            for i in range(count)]


def timed_chunks(lines: list[dict], src: Path, out: Path, batch_size: int, port: int | None) -> tuple[float, float]:
    """Seconds to answer every row with ``millm batch`` (``batch_size`` rows at a time, into ``out``) and to
    send the same rows one request at a time to a running ``millm serve`` (NaN with ``port`` None).

    The two alternate chunk by chunk, both warmed first, so load from other work on a shared machine falls
    on both sides alike rather than on whichever ran first.
    """
    from cli.common import engine_for, steering_service
    from millm.batch.answer import Answerer
    from millm.batch.run import open_job, write_answers
    from millm.config import get_settings

    job = open_job(src, out)
    answerer = Answerer(lambda entry: engine_for(entry.id), steering_service(), get_settings(), job.created)
    answerer.answer(job.todo[:1])  # load and warm, as the served baseline is
    served, batched = 0.0, 0.0
    with ExitStack() as stack:
        http = None
        if port is not None:
            base = stack.enter_context(millm_server(port))
            http = stack.enter_context(httpx.Client(base_url=base, timeout=600))
            http.post(lines[0]["url"], json=lines[0]["body"]).raise_for_status()  # warm
        sink = stack.enter_context(out.open("a"))
        for start in range(0, len(job.todo), batch_size):
            if http is not None:
                began = time.perf_counter()
                for line in lines[start:start + batch_size]:
                    http.post(line["url"], json=line["body"]).raise_for_status()
                served += time.perf_counter() - began
            began = time.perf_counter()
            write_answers(answerer, job.todo[start:start + batch_size], sink, batch_size)
            batched += time.perf_counter() - began
    return (served if http is not None else float("nan")), batched


def ray_batch(src: Path, out: Path, batch_size: int, workers: int) -> float:
    """Wall seconds of a Ray job, the actors' start and model load included."""
    from cli.common import steering_service
    from millm.batch.distributed import answer_on_ray
    from millm.batch.run import open_job
    from millm.config import get_settings

    job = open_job(src, out)
    start = time.perf_counter()
    answer_on_ray(job, out, steering_service(), get_settings(), None, workers, batch_size)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--port", type=int, default=8790)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--no-served", action="store_true", help="skip the one-by-one baseline")
    args = parser.parse_args()

    from millm.config import get_settings

    lines = rows(args.rows, args.max_tokens, get_settings().default_model)
    folder = Path(tempfile.mkdtemp(prefix="millm-bench-batch-"))
    src = folder / "in.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))

    served, batched = timed_chunks(lines, src, folder / "local.jsonl", args.batch_size,
                                   None if args.no_served else args.port)
    n = args.rows
    print(f"{n} short chats, max_tokens {args.max_tokens}, batch {args.batch_size}")
    print(f"  millm serve, one by one : {served:7.1f} s  {n / served:6.2f} rows/s")
    print(f"  millm batch             : {batched:7.1f} s  {n / batched:6.2f} rows/s  "
          f"{served / batched:.2f}x one-by-one (target >= 3x)")
    if args.no_ray:
        return
    import ray

    # one local instance for every job: its own start is not Ray's per-job cost
    ray.init(log_to_driver=False, include_dashboard=False)
    before = n / batched
    first = folder / "first.jsonl"
    first.write_text("".join(json.dumps(line) + "\n" for line in lines[:args.batch_size]))
    ray_batch(first, folder / "ray-warm.jsonl", args.batch_size, args.workers)  # the instance's one-time costs
    wall = ray_batch(src, folder / "ray.jsonl", args.batch_size, args.workers)
    same = (folder / "ray.jsonl").read_bytes() == (folder / "local.jsonl").read_bytes()
    one_batch = ray_batch(first, folder / "ray-first.jsonl", args.batch_size, args.workers)
    ray.shutdown()
    after = n / timed_chunks(lines, src, folder / "local-after.jsonl", args.batch_size, None)[1]
    local = (before + after) / 2
    print(f"  millm batch again, after the Ray jobs: {after:6.2f} rows/s; mean of the two passes {local:6.2f} rows/s")
    if abs(before - after) > 0.15 * local:
        print("  !! the two local passes differ by more than 15%: other work came or went during the run, so the "
              "Ray figures below are not comparable; run again on a quiet machine")
    print(f"  millm batch --ray ({args.workers} worker{'s' if args.workers > 1 else ''}): {wall:7.1f} s wall "
          f"(actor start and model load included), output equal to local: {same}")
    per_worker = (n - args.batch_size) / max(wall - one_batch, 1e-9) / args.workers
    ratio = per_worker * args.workers / local
    print(f"    marginal rate (job of {n} rows minus a job of one batch, model load in neither): "
          f"{per_worker:6.2f} rows/s per worker, {ratio:.2f}x without Ray (target >= 0.8x)")
    fixed = one_batch - args.batch_size / per_worker
    print(f"    per-job start (actor start and model load, before the first batch): {fixed:5.1f} s; whole job "
          f"with it: {n / wall:6.2f} rows/s, {(n / wall) / local:.2f}x without Ray (whose load is not timed)")
    for workers in (4, 16, 64):
        print(f"    expected with {workers:>2} workers: {workers * per_worker:8.1f} rows/s (workers x per-worker rate)")


if __name__ == "__main__":
    main()
