"""Rows over a Ray cluster with Ray Data: ``read_json`` -> ``map_batches`` over an actor pool (one engine
per actor, a GPU each where CUDA is present) -> the output file, written by the driver in input order.

The driver writes the pending rows to a JSONL file of ``{"index", "line"}`` records (each ``line`` a
string, so Ray's schema inference never meets a request body), and streams the workers' rendered output
lines back with order preserved, appending each as it arrives: a stopped job resumes like a local one.
Workers render every output line themselves with the same functions as a local run, so the files are
equal byte for byte.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from millm.errors import InvalidParameter

if TYPE_CHECKING:
    from millm.batch.run import BatchJob
    from millm.batch.steer import JobSteering
    from millm.config import Settings
    from millm.steering.service import SteeringService

Advance = Callable[[int, int], None]  # rows written, tokens in them
INSTALL_HINT = "--ray needs Ray Data, an optional extra: pip install -e .[ray]  (or pip install 'ray[data]')."


def require_ray() -> Any:
    """The ``ray`` module with Ray Data, or a clear error saying how to install it."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise InvalidParameter(INSTALL_HINT, param="ray") from None
    return ray


@contextmanager
def ray_session(address: str | None) -> Iterator[Any]:
    """Ray, connected for the block: a local instance for ``address`` None, else the cluster at ``address``
    (``auto``: the one this node belongs to), shut down after; a session already connected is used as it is.
    No cluster there is a clear error, not Ray's ConnectionError and its traceback."""
    ray = require_ray()
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False, include_dashboard=False)
        except ConnectionError:
            raise InvalidParameter(f"No Ray cluster was found at {address}: start one with `ray start --head`, "
                                   "or use --ray local.", param="ray") from None
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def actor_resources() -> dict[str, float]:
    """What each actor asks of Ray: one GPU where the driver sees CUDA, else one CPU."""
    import torch

    return {"num_gpus": 1.0} if torch.cuda.is_available() else {"num_cpus": 1.0}


def actor_env() -> dict[str, Any]:
    """The actors' runtime environment: the driver's MILLM_* settings, and the driver's niceness. Ray starts
    every worker process at niceness 15 so that its own daemons win the CPU; an actor that computes the
    job's answers then loses its core to anything else on the node (the driver's Ray Data executor, Ray's
    own helper actors, any other process), and a one-worker job runs well below the local rate.
    ``RAY_worker_niceness`` is the increment Ray's worker applies to itself at start (from the raylet's
    niceness, normally 0), so it is never negative: a priority above the raylet's would need privilege."""
    env = {k: v for k, v in os.environ.items() if k.startswith("MILLM_")}
    return {"env_vars": {**env, "RAY_worker_niceness": str(max(0, os.getpriority(os.PRIO_PROCESS, 0)))}}


def read_on_this_node(ray: Any) -> dict[str, Any]:
    """The read runs where the driver wrote its file, and takes no CPU an actor is waiting for (with every
    CPU given to actors, a read that needs one never starts)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    return {"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}


def run_rows(rows: list[tuple[int, str]], worker: type, worker_args: dict[str, Any], address: str | None,
             workers: int, batch_size: int, write: Callable[[str], None], advance: Advance | None = None) -> None:
    """``worker(**worker_args)`` answers batches ``{"index", "line"}`` with ``{"out", "tokens"}``; every
    ``out`` (a finished output line) is passed to ``write`` in input order. Each argument travels through
    Ray's object store once, as ``[ref]``; a worker reads it with ``shipped(arg)``, and is also given
    ``threads`` for ``match_threads``.

    The rows are read as blocks of one batch each: a block is one task on one actor, so with fewer blocks
    than batches some actors idle (one block fed a whole job to one actor), and a batch's lines reach
    ``write`` (what a resumed job keeps) only when its whole block is done."""
    if not rows:
        return
    with ray_session(address) as ray:
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True
        context.enable_progress_bars = False
        with tempfile.TemporaryDirectory(prefix="millm-ray-") as folder:
            source = Path(folder) / "rows.jsonl"
            source.write_text("".join(json.dumps({"index": i, "line": text}) + "\n" for i, text in rows))
            shipped = {name: [ray.put(value)] for name, value in {**worker_args, "threads": driver_threads()}.items()}
            dataset = ray.data.read_json(str(source), override_num_blocks=-(-len(rows) // batch_size),
                                         ray_remote_args=read_on_this_node(ray))
            dataset = dataset.map_batches(worker, fn_constructor_kwargs=shipped, batch_size=batch_size,
                                          compute=ray.data.ActorPoolStrategy(size=workers), batch_format="numpy",
                                          runtime_env=actor_env(), **actor_resources())
            for row in dataset.iter_rows():
                write(str(row["out"]))
                if advance is not None:
                    advance(1, int(row["tokens"]))


def shipped(arg: list[Any]) -> Any:
    """A worker argument ``run_rows`` sent through the object store."""
    import ray

    return ray.get(arg[0])


def driver_threads() -> int:
    """The driver's torch thread count, for workers to match (``run_rows`` passes it as ``threads``)."""
    import torch

    return torch.get_num_threads()


def match_threads(threads: list[Any]) -> None:
    """Compute with the driver's thread count rather than the one CPU Ray gives an actor: a reduction split
    over a different number of threads rounds differently, and the files must match byte for byte."""
    import torch

    torch.set_num_threads(int(shipped(threads)))


class BatchWorker:
    """One Ray actor of a ``millm batch`` job: the shipped steering state installed in a directory of its
    own, an engine per model (loaded on first use, its persisted steering restored, the job's ``--steer`` values
    merged in), and an Answerer."""

    def __init__(self, state: list[Any], created: list[Any], shares: list[Any], threads: list[Any],
                 steer: list[Any]) -> None:
        from millm.batch.answer import Answerer
        from millm.batch.shipped import install
        from millm.batch.steer import SteeredEngines
        from millm.config import get_settings
        from millm.engine import Engine, load_engine
        from millm.registry import ModelEntry

        match_threads(threads)
        self.home = Path(tempfile.mkdtemp(prefix="millm-worker-"))
        steering = install(shipped(state), self.home)
        settings = get_settings()
        engines: dict[str, Engine] = {}

        def engine_for(entry: ModelEntry) -> Engine:
            if entry.id not in engines:
                engines[entry.id] = load_engine(entry, settings)
                steering.restore(engines[entry.id].steering_target())
            return engines[entry.id]

        self.answerer = Answerer(SteeredEngines(engine_for, shipped(steer)), steering, settings, shipped(created),
                                 shipped(shares))  # the job's --steer stays on the actor's own engines

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        from millm.batch.lines import from_wire, output_line

        answers = self.answerer.answer([from_wire(str(text)) for text in batch["line"]])
        return {"out": np.array([output_line(a) for a in answers], dtype=object),
                "tokens": np.array([a.tokens for a in answers], dtype=np.int64)}


def models_named(job: BatchJob, settings: Settings) -> list[str]:
    """The model ids the pending lines name (names that do not resolve are answered by the workers)."""
    from millm.errors import MillmError
    from millm.registry import resolve

    ids: set[str] = set()
    for name in {line.body.get("model") for line in job.todo if line.refusal is None and isinstance(line.body, dict)}:
        if isinstance(name, str):
            try:
                ids.add(resolve(name, settings).id)
            except MillmError:
                continue
    return sorted(ids)


def answer_on_ray(job: BatchJob, output: Path, steering: SteeringService, settings: Settings, address: str | None,
                  workers: int, batch_size: int, advance: Advance | None = None, shares: bool = True,
                  steer: JobSteering | None = None) -> None:
    """A batch job's pending lines over Ray, appended to ``output`` in input order; ``steer``: the job's
    ``--steer`` values (``millm.batch.steer``), merged into each worker's live values."""
    from millm.batch.lines import to_wire
    from millm.batch.shipped import capture

    require_ray()
    state = capture(steering, models_named(job, settings))
    with output.open("a", encoding="utf-8") as sink:
        def write(line: str) -> None:
            sink.write(line)
            sink.flush()

        run_rows([(line.index, to_wire(line)) for line in job.todo], BatchWorker,
                 {"state": state, "created": job.created, "shares": shares, "steer": steer}, address, workers,
                 batch_size, write, advance)
