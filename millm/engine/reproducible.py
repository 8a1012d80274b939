"""MKL in its reproducible mode, so that a forward's numbers on the CPU do not depend on its threads.

On the CPU ``sdpa`` runs torch's flash-attention kernel. It deals the heads (for a decode step, each key-value head
with its queries) out to the OpenMP threads, gives each thread its own slice of one scratch buffer, and multiplies
through MKL. In its default mode MKL rounds a product differently when an operand is not 16-byte aligned (the same
product into a buffer 4, 8 or 12 bytes further on gives other bits), and a thread's slice starts ``thread * slice``
floats in: for the bundled model's decode steps a slice is ``3 * (keys + 66)`` floats, never a multiple of four, so
thread 1's scratch is misaligned where thread 0's is not, and a head rounds differently on it. So the logits of
every decode step depended on how many threads computed it, and a seeded answer could change with anything that
changes that number: ``OMP_NUM_THREADS``, the CPUs a process may use when it starts (taskset, a container's
cpuset), OpenMP's dynamic mode (``OMP_DYNAMIC=true`` sizes each parallel region by the load average, so a busy
machine computes with fewer threads), a Ray actor given one CPU. The linear layers (oneDNN, ``millm.engine.packed``),
norms, activations and the sampler already give the same bits at every thread count.

MKL's conditional numerical reproducibility (CNR) mode rounds alike at any alignment, which makes every head round
alike on every thread (``bench/reproducible.py`` checks it and prices it). MKL reads its mode once, at
its first computation, from ``MKL_CBWR``: ``import millm`` sets that variable to :data:`MODE` unless it is set
already (an empty value keeps MKL's default), and loading a transformers engine checks the mode in force
(:func:`ensure_reproducible_mkl`), setting it itself when MKL has not computed yet.

OpenMP's dynamic mode is worse than a changed count: it sizes each parallel region by the load average, while
oneDNN plans a packed product for the full thread count, so on a busy machine a region run with fewer threads
leaves part of the product unwritten (logits of 1e38, or NaN). ``import millm`` turns an ``OMP_DYNAMIC`` that asks
for it off (OpenMP reads the variable when torch loads it), and :func:`ensure_static_openmp` turns it off for the
loading thread when torch was imported first, with a warning.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ENV = "MKL_CBWR"
MODE = "AUTO"  # CNR on, the best branch for this CPU (what ``import millm`` puts in ENV)
_BRANCH = 1  # MKL_CBWR_BRANCH: ask for the branch in force
_OFF = 1  # MKL_CBWR_BRANCH_OFF: CNR off, MKL's default
_AUTO = 2  # MKL_CBWR_AUTO
_SUCCESS = 0
_GOMP = ("libgomp.so.1", "libgomp.so", "libiomp5.so")  # the OpenMP runtimes torch's wheels ship or link
# the public names (a shared MKL), then those of the MKL that torch's wheels link into libtorch_cpu
_GETTERS, _SETTERS = ("mkl_cbwr_get", "mkl_serv_cbwr_get"), ("mkl_cbwr_set", "mkl_serv_cbwr_set")
_noted: set[str] = set()


def _loaded(names: tuple[str, ...]) -> list[ctypes.CDLL]:
    """The libraries of ``names`` this process has loaded (torch's own copy first); nothing new is loaded."""
    import torch

    handles: list[ctypes.CDLL] = []
    for name in names:
        path = Path(torch.__file__).parent / "lib" / name
        try:
            handles.append(ctypes.CDLL(str(path) if path.exists() else name,
                                       mode=getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LAZY", 1)))
        except OSError:
            continue
    return handles


def _loaded_mkl() -> tuple[Any, Any] | None:
    """``(get, set)`` of the MKL this process's torch computes with, or None where there is none to reach (no MKL
    in this torch, or its CNR functions not exported)."""
    import torch

    if not torch.backends.mkl.is_available():
        return None
    for lib in _loaded(("libtorch_cpu.so", "libmkl_rt.so.2", "libmkl_rt.so")):
        get = next((getattr(lib, n) for n in _GETTERS if hasattr(lib, n)), None)
        put = next((getattr(lib, n) for n in _SETTERS if hasattr(lib, n)), None)
        if get is not None and put is not None:
            get.restype = put.restype = ctypes.c_int
            get.argtypes = put.argtypes = [ctypes.c_int]
            return get, put
    return None


def mkl_branch() -> int | None:
    """MKL's CNR branch in force (1: off, 2: auto, 3: compatible, more: one instruction set), or None without MKL.
    Asking does not fix the mode: MKL fixes it at its first computation."""
    mkl = _loaded_mkl()
    return None if mkl is None else int(mkl[0](_BRANCH))


def ensure_reproducible_mkl() -> bool:
    """Whether MKL computes in a reproducible (CNR) mode, or there is no MKL to ask: the mode is set here when MKL
    has not computed yet. False, with one warning, when MKL already computed in its default mode (something
    multiplied before miLLM was imported), or when ``MKL_CBWR`` is set empty (MKL's default asked for: said once, as
    information)."""
    mkl = _loaded_mkl()
    if mkl is None:
        return True
    get, put = mkl
    if get(_BRANCH) != _OFF:
        return True
    if os.environ.get(ENV, MODE) == "":
        _note_once(logging.INFO, "off", "MKL_CBWR is set empty, so MKL runs in its default mode: on the CPU a seeded "
                                        "answer can change with the number of threads (millm.engine.reproducible)")
        return False
    if put(_AUTO) == _SUCCESS and get(_BRANCH) != _OFF:
        return True
    _note_once(logging.WARNING, "late", "MKL computed before miLLM could ask for its reproducible mode, so on the CPU "
                                        "a seeded answer can change with the number of threads; set MKL_CBWR=AUTO in "
                                        "the environment, or import millm before anything multiplies "
                                        "(millm.engine.reproducible)")
    return False


def ensure_static_openmp() -> bool:
    """Whether OpenMP runs every parallel region of this thread with its full thread count (or there is no OpenMP
    runtime to ask): its dynamic mode is turned off here, with one warning, when it was on (``OMP_DYNAMIC=true``
    read before ``import millm`` could turn it off; other threads keep what the variable said)."""
    for lib in _loaded(_GOMP):
        if not (hasattr(lib, "omp_get_dynamic") and hasattr(lib, "omp_set_dynamic")):
            continue
        if not lib.omp_get_dynamic():
            return True
        lib.omp_set_dynamic(0)
        _note_once(logging.WARNING, "dynamic", "OpenMP's dynamic mode was on (OMP_DYNAMIC=true, read before millm was "
                                               "imported): on a busy machine it runs a parallel region with fewer "
                                               "threads than oneDNN planned a packed product for, leaving part of it "
                                               "unwritten. It is off for this thread now; unset OMP_DYNAMIC, or import "
                                               "millm before torch (millm.engine.reproducible)")
        return False
    return True


def ensure_reproducible_cpu() -> bool:
    """Both: MKL in its reproducible mode (:func:`ensure_reproducible_mkl`) and OpenMP's dynamic mode off
    (:func:`ensure_static_openmp`), each warning once where it could not be had; whether both held."""
    static = ensure_static_openmp()
    return ensure_reproducible_mkl() and static


def _note_once(level: int, key: str, message: str) -> None:
    if key not in _noted:
        _noted.add(key)
        log.log(level, message)
