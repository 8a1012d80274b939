"""MKL's reproducible mode (what ``import millm`` asks for, ``millm.engine.reproducible``) against its default, on
the bundled model on the CPU: whether a seeded answer's logits are the same at 1 and at the default number of
threads, and what the mode costs in speed.

    python bench/reproducible.py                 # 3 rounds: decode alone, 16 rows, scoring (24 tokens)
    python bench/reproducible.py --rounds 5 --rows 48
    python bench/reproducible.py --kernel --rounds 9   # the attention calls alone, no model loaded

MKL fixes its mode at its first computation, for the life of the process, so the two cannot share one process:
each round runs one child process per mode (``MKL_CBWR=AUTO``, then ``MKL_CBWR=`` empty, MKL's default), one after
the other, and the speeds are compared round by round (load that comes or goes on a shared machine falls on both
alike within a round). Per mode: a seeded chat answer decoded alone (tokens/s), ``--rows`` seeded answers decoded
together (tokens/s), those answers scored (echo; tokens/s), and whether the first answer's logits were the same,
bit for bit, computed with 1 thread and with 2 (or the default count, if more). ``--threads`` times the model at
that many threads (1 keeps a shared machine's other work from stalling each parallel region on a preempted
thread, which at 2 threads on 2 busy cores swamps what is measured). With ``--kernel``, each child times the attention
calls of the model's forwards alone (microseconds a call) and checks their bits at 1 to 4 threads: where the mode
acts, without a model load or the rest of a forward to dilute it. Printed per round, then the reproducible mode's
speed over the default's: the median of the rounds' ratios, and best run against best run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODES = {"reproducible": "AUTO", "default": ""}
# the attention calls of the bundled model's forwards (rows, queries, keys): decode steps, a prompt, a scored text
KERNEL_SHAPES = ((1, 1, 64), (1, 1, 512), (16, 1, 128), (1, 38, 64), (1, 256, 256))


def kernel(calls: int) -> dict[str, float | bool]:
    """Microseconds per attention call (the bundled model's heads: 9 query heads over 3 key-value heads of 64) at
    each of KERNEL_SHAPES, the median of 5 timings of ``calls`` calls; and whether each gives the same bits at 1 to 4
    threads."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(0)
    out: dict[str, float | bool] = {}
    same = True
    for rows, queries, keys in KERNEL_SHAPES:
        q = torch.randn(rows, 9, queries, 64, generator=gen)
        k, v = torch.randn(rows, 3, keys, 64, generator=gen), torch.randn(rows, 3, keys, 64, generator=gen)
        mask = torch.arange(keys).view(1, 1, 1, keys) <= torch.arange(keys - queries, keys).view(1, 1, queries, 1)
        before = torch.get_num_threads()
        results = []
        for count in (1, 2, 3, 4):
            torch.set_num_threads(count)
            results.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))
        torch.set_num_threads(before)
        same = same and all(torch.equal(r, results[0]) for r in results[1:])
        timings = []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(calls):
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            timings.append((time.perf_counter() - started) / calls * 1e6)
        out[f"{rows}x{queries}x{keys}"] = statistics.median(timings)
    out["same_at_1_to_4_threads"] = same
    return out


def child(rows: int, tokens: int, threads: int) -> dict[str, float | bool]:
    """This process's figures (run with MKL_CBWR already set by the parent), timed at ``threads`` threads (0: the
    default)."""
    import torch

    from millm.config import get_settings
    from millm.engine import load_engine
    from millm.engine.events import Delta
    from millm.engine.transformers_engine import TransformersEngine
    from millm.registry import BUNDLED_ID, resolve
    from millm.research.answers import chat_request, sample_answers
    from millm.research.measure import NEUTRAL_PROMPTS, Measure

    settings = get_settings()
    engine = load_engine(resolve(BUNDLED_ID, settings), settings)
    assert isinstance(engine, TransformersEngine)
    heads: list[torch.Tensor] = []
    hook = engine.model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: heads.append(out.detach().clone()))
    request = chat_request(NEUTRAL_PROMPTS[0], 7, tokens)
    found: dict[str, list[torch.Tensor]] = {}
    for count in (1, max(2, torch.get_num_threads())):
        before = torch.get_num_threads()
        torch.set_num_threads(count)
        heads.clear()
        list(engine.generate(request))
        found[str(count)] = list(heads)
        torch.set_num_threads(before)
    hook.remove()
    same = all(torch.equal(a, b) for a, b in zip(*found.values())) and len(set(map(len, found.values()))) == 1
    if threads:
        torch.set_num_threads(threads)
    prompts = [NEUTRAL_PROMPTS[i % len(NEUTRAL_PROMPTS)] for i in range(rows)]
    started = time.perf_counter()
    alone = sum(isinstance(e, Delta) for e in engine.generate(request)) / (time.perf_counter() - started)
    started = time.perf_counter()
    [texts] = sample_answers(engine, prompts, 0, tokens)
    batch = time.perf_counter() - started
    measure = Measure(engine, prompts, 0, tokens)
    started = time.perf_counter()
    made = sum(n for _, n in measure.logprobs(texts))
    score = time.perf_counter() - started
    return {"alone": alone, "batch": made / batch, "score": made / score, "same_at_1_thread": same}


def run_child(mode: str, args: list[str]) -> dict[str, float | bool]:
    """This script run as a child with ``MKL_CBWR=mode``: its figures."""
    out = subprocess.run([sys.executable, __file__, "--child", *args], env={**os.environ, "MKL_CBWR": mode},
                         capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def report(found: dict[str, list[dict[str, float | bool]]], keys: list[str], higher: bool) -> None:
    """The reproducible mode's speed over the default's per key: the median of the rounds' ratios, and best
    against best (the least disturbed run of each, on a shared machine)."""
    for key in keys:
        mine, theirs = [float(f[key]) for f in found["reproducible"]], [float(f[key]) for f in found["default"]]
        ratios = [(a / b if higher else b / a) for a, b in zip(mine, theirs)]
        best = max(mine) / max(theirs) if higher else min(theirs) / min(mine)
        print(f"{key}: reproducible {statistics.median(ratios):.2f}x default (median of rounds), "
              f"{best:.2f}x best against best")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=16, help="answers decoded together")
    parser.add_argument("--tokens", type=int, default=24, help="tokens per answer")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="threads to time the model with (0: the default)")
    parser.add_argument("--kernel", action="store_true", help="time the attention calls alone, no model")
    parser.add_argument("--calls", type=int, default=200, help="--kernel: calls per timing")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        got = kernel(args.calls) if args.kernel else child(args.rows, args.tokens, args.threads)
        print(json.dumps(got), flush=True)
        return
    child_args = (["--kernel", "--calls", str(args.calls)] if args.kernel
                  else ["--rows", str(args.rows), "--tokens", str(args.tokens), "--threads", str(args.threads)])
    found: dict[str, list[dict[str, float | bool]]] = {name: [] for name in MODES}
    for _ in range(args.rounds):
        for name, mode in MODES.items():
            got = run_child(mode, child_args)
            found[name].append(got)
            shown = {k: v for k, v in got.items() if not isinstance(v, bool)}
            unit = "us" if args.kernel else "tok/s"
            print(f"{name:>12} (MKL_CBWR={mode!r}): " + ", ".join(f"{k} {v:.0f} {unit}" for k, v in shown.items())
                  + "; " + ", ".join(f"{k} {v}" for k, v in got.items() if isinstance(v, bool)), flush=True)
    if args.kernel:
        report(found, [f"{r}x{q}x{k}" for r, q, k in KERNEL_SHAPES], higher=False)
    else:
        report(found, ["alone", "batch", "score"], higher=True)


if __name__ == "__main__":
    main()
