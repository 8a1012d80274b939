"""A seed fixes the numbers on the CPU whatever computes them: the same logits, bit for bit, and the same tokens
idle, beside processes that keep the cores busy, and at any number of threads (issue 49, item 8).

The cause was the CPU attention kernel: MKL, in its default mode, rounded a head differently on a thread whose
scratch was aligned differently, so a decode step's logits depended on the thread count (and OpenMP's dynamic mode
sizes a region by the machine's load, which for oneDNN's packed products is worse: part of them unwritten).
``millm.engine.reproducible`` puts MKL in its reproducible mode and keeps OpenMP's dynamic mode off.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

BURN_SECONDS = 300  # a burner's own bound, should the test die before it kills it


@contextmanager
def threads(count: int) -> Iterator[None]:
    """torch computing with ``count`` intra-op threads, restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def burners(count: int) -> Iterator[None]:
    """``count`` processes spinning on the CPU (each stops itself after BURN_SECONDS), killed on the way out."""
    loop = f"import time\nend = time.monotonic() + {BURN_SECONDS}\nwhile time.monotonic() < end: pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(count)]
    try:
        time.sleep(0.3)  # running before the first forward
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def test_an_mkl_product_rounds_alike_at_any_alignment():
    """The cause, alone: the same product into buffers 0 to 15 floats into an allocation (a thread's scratch in the
    attention kernel is such a slice) gives the same bits; MKL's default mode rounds it differently off 16 bytes."""
    import torch

    gen = torch.Generator().manual_seed(0)
    values, probs = torch.randn(64, 64, generator=gen), torch.rand(3, 64, generator=gen)
    outs = []
    with threads(1):
        for offset in range(16):
            scratch, out = torch.zeros(256), torch.zeros(256)
            a = scratch[offset:offset + 192].view(3, 64)
            a.copy_(probs)
            outs.append(torch.mm(a, values, out=out[offset:offset + 192].view(3, 64)).clone())
    assert all(torch.equal(out, outs[0]) for out in outs[1:])


def test_cpu_attention_rounds_alike_at_every_thread_count():
    """A decode step's attention (one query per head, grouped by key-value head as the bundled model's are) gives
    the same bits at 1 to 4 threads: each head rounds the same on whichever thread computes it."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 9, 1, 64, generator=gen), torch.randn(2, 3, 64, 64, generator=gen), \
        torch.randn(2, 3, 64, 64, generator=gen)
    mask = torch.arange(64).view(1, 1, 1, 64) <= torch.tensor([40, 63]).view(2, 1, 1, 1)
    outs = []
    for count in (1, 2, 3, 4):
        with threads(count):
            outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))
    assert all(torch.equal(out, outs[0]) for out in outs[1:])


def test_importing_millm_asks_mkl_for_its_reproducible_mode():
    import os

    from millm.engine.reproducible import ENV, MODE, ensure_reproducible_mkl, mkl_branch

    if os.environ.get(ENV) != MODE:
        pytest.skip(f"the environment set {ENV} itself")
    assert ensure_reproducible_mkl()
    assert mkl_branch() in (None, 2)  # None: this torch has no MKL; 2: MKL_CBWR_AUTO


def test_an_empty_mkl_cbwr_is_left_to_mkl():
    """An empty MKL_CBWR is someone asking for MKL's default mode: importing millm leaves it as it is."""
    import os

    code = "import os, millm; print(repr(os.environ['MKL_CBWR']))"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "MKL_CBWR": ""}, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == repr("")


def test_importing_millm_turns_openmp_dynamic_mode_off():
    """OMP_DYNAMIC=true sizes parallel regions by the load average, which leaves part of a packed product unwritten
    on a busy machine: importing millm before torch turns it off."""
    import os

    code = ("import ctypes, millm, torch\n"
            "from millm.engine.reproducible import _GOMP, _loaded\n"
            "print([lib.omp_get_dynamic() for lib in _loaded(_GOMP) if hasattr(lib, 'omp_get_dynamic')][:1])")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "OMP_DYNAMIC": "true"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() in ("[0]", "[]")  # []: no OpenMP runtime in this torch


def test_loading_turns_openmp_dynamic_mode_off_for_its_thread_when_torch_read_it_first():
    from millm.engine.reproducible import _GOMP, _loaded, ensure_static_openmp

    runtimes = [lib for lib in _loaded(_GOMP) if hasattr(lib, "omp_set_dynamic")]
    if not runtimes:
        pytest.skip("no OpenMP runtime in this torch")
    runtimes[0].omp_set_dynamic(1)
    try:
        assert not ensure_static_openmp()  # it was on: turned off, with a warning
        assert runtimes[0].omp_get_dynamic() == 0 and ensure_static_openmp()
    finally:
        runtimes[0].omp_set_dynamic(0)


Run = tuple[str, list[Any], list[Any]]  # the text, the ids fed to each forward, the output layer's logits


def seeded_run(engine: Any, fed: list[Any], heads: list[Any]) -> Run:
    """The issue's request (temperature 1, seed 7; 12 tokens) answered: its text, what each forward was fed (the
    prompt, then each drawn token) and each forward's logits."""
    from millm.engine.events import Delta
    from millm.engine.params import ChatPrompt, GenerationRequest, SamplingParams
    from millm.research.answers import UNSTEERED

    request = GenerationRequest([ChatPrompt([{"role": "user", "content": "Tell me a one-line story."}])],
                                SamplingParams(temperature=1.0, seed=7, max_tokens=12), steering=UNSTEERED)
    fed.clear()
    heads.clear()
    text = "".join(e.text for e in engine.generate(request) if isinstance(e, Delta))
    return text, list(fed), list(heads)


def test_a_seeded_answer_is_the_same_idle_beside_burners_and_at_any_thread_count(engine):
    import torch

    fed: list[Any] = []
    heads: list[Any] = []
    hooks = [engine.model.get_input_embeddings().register_forward_pre_hook(
                 lambda module, args: fed.append(args[0].detach().clone())),
             engine.model.get_output_embeddings().register_forward_hook(
                 lambda module, args, out: heads.append(out.detach().clone()))]
    try:
        text, ids, logits = seeded_run(engine, fed, heads)
        runs = {"idle, again": seeded_run(engine, fed, heads)}
        with burners(2):
            runs["beside 2 burners"] = seeded_run(engine, fed, heads)
            runs["beside 2 burners, again"] = seeded_run(engine, fed, heads)
        for count in (1, 3):
            with threads(count):
                runs[f"{count} thread(s)"] = seeded_run(engine, fed, heads)
    finally:
        for hook in hooks:
            hook.remove()
    assert text and len(logits) == len(ids) > 1
    for name, (got_text, got_ids, got_logits) in runs.items():
        assert got_text == text, name
        assert len(got_ids) == len(ids) and all(torch.equal(a, b) for a, b in zip(ids, got_ids)), name
        differs = [i for i, (a, b) in enumerate(zip(logits, got_logits)) if not torch.equal(a, b)]
        assert not differs and len(got_logits) == len(logits), f"{name}: the logits of steps {differs} differ"
