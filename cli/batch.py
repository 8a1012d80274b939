"""``millm batch``: an OpenAI batch file answered as the server would answer each line, resumable,
on this process or over a Ray cluster (``--ray``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cli.common import engine_for, err, reports_errors, sae_ref, steering_service
from millm.config import get_settings
from millm.errors import InvalidParameter

if TYPE_CHECKING:
    from millm.batch.run import BatchJob
    from millm.batch.steer import JobSteering

RAY_HELP = ("Run on Ray: 'local' starts a local instance, 'auto' joins the cluster of this node, or give the "
            "address of its head (HEAD_IP:6379).")
LOCAL = "local"
RayOption = Annotated[str | None, typer.Option("--ray", metavar="ADDRESS", help=RAY_HELP)]
WorkersOption = Annotated[int, typer.Option(help="Ray actors, one engine each (with --ray).")]


def check_counts(batch_size: int, workers: int) -> None:
    """``--batch-size`` and ``--workers`` are counts: at least 1, refused before anything loads."""
    if batch_size < 1:
        raise InvalidParameter("--batch-size must be at least 1.", param="batch_size")
    if workers < 1:
        raise InvalidParameter("--workers must be at least 1.", param="workers")


def ray_address(value: str) -> str | None:
    """What ``ray.init`` is given: None starts a local instance."""
    return None if value == LOCAL else value


@contextmanager
def progress_bar(label: str, total: int, done: int) -> Iterator[Callable[[int, int], None]]:
    """A bar with rows/s and tokens/s over this run's rows; yields the callback each answered chunk calls."""
    started = time.monotonic()
    counted = {"rows": 0, "tokens": 0}
    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rows]} rows/s"),
               TextColumn("{task.fields[tokens]} tok/s"), TimeElapsedColumn())
    with Progress(*columns, console=err) as progress:
        task = progress.add_task(label, total=total, completed=done, rows="-", tokens="-")

        def advance(rows: int, tokens: int) -> None:
            counted["rows"] += rows
            counted["tokens"] += tokens
            elapsed = max(time.monotonic() - started, 1e-9)
            progress.update(task, advance=rows, rows=f"{counted['rows'] / elapsed:.1f}",
                            tokens=f"{counted['tokens'] / elapsed:.0f}")

        yield advance


@reports_errors
def batch(
    input: Annotated[Path, typer.Argument(help="OpenAI batch input: one {\"custom_id\", \"method\": \"POST\", "
                                               "\"url\": \"/v1/...\", \"body\"} per line.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="OpenAI batch output, one line per input line, "
                                                                "in input order; lines already there are kept.")],
    batch_size: Annotated[int, typer.Option("--batch-size", help="Lines answered together; their generation "
                                                                 "lines decode as one batch.")] = 16,
    ray: RayOption = None,
    workers: WorkersOption = 1,
    sae: Annotated[str | None, typer.Option(help="SAE --steer names features of (attached to a model the lines "
                                                 "name; default: the one attached there).")] = None,
    steer: Annotated[list[str] | None, typer.Option(help="FEATURE=STRENGTH added to the live values for this job "
                                                          "only, as chat --steer reads it; FEATURE alone takes its "
                                                          "recommended strength (repeatable).")] = None,
) -> None:
    """Answer every line of an OpenAI batch file as `millm serve` would; rerun to resume after a stop."""
    from millm.batch.answer import Answerer
    from millm.batch.run import open_job, write_answers
    from millm.batch.steer import SteeredEngines

    check_counts(batch_size, workers)
    job = open_job(input, output)
    job_steer = job_steering(job, sae, steer or [])  # refused before any line is answered
    if ray is not None:
        from millm.batch.distributed import answer_on_ray, ray_session

        # connected first: no cluster at the address is one line and exit 1, before any work or progress bar
        with ray_session(ray_address(ray)), progress_bar("batch (ray)", len(job.lines), job.done) as advance:
            answer_on_ray(job, output, steering_service(), get_settings(), ray_address(ray), workers, batch_size,
                          advance, steer=job_steer)
    else:
        engines = SteeredEngines(lambda entry: engine_for(entry.id), job_steer)
        answerer = Answerer(engines, steering_service(), get_settings(), job.created)
        try:
            with output.open("a", encoding="utf-8") as sink, \
                    progress_bar("batch", len(job.lines), job.done) as advance:
                write_answers(answerer, job.todo, sink, batch_size, advance)
        finally:
            engines.undo()
    steered = f"; steered with {job_steer.describe()} over the live values" if job_steer is not None else ""
    err.print(f"answered {len(job.todo)} lines ({job.done} already done) -> {output}{steered}", markup=False)


def job_steering(job: BatchJob, sae: str | None, steer: list[str]) -> JobSteering | None:
    """``--sae``/``--steer`` for the whole job (``millm.batch.steer``): the SAE, attached to a model the lines
    name, and the values as ``chat --steer`` resolves them (``cli.sae_train.steer_assignments``: a feature alone
    takes its recommended strength, and stderr says which); None without ``--steer``."""
    from cli.sae_train import steer_assignments
    from millm.batch.distributed import models_named
    from millm.batch.steer import JobSteering, steered_sae
    from millm.steering.values import check_values

    if not steer:
        if sae is not None:
            raise InvalidParameter("--sae goes with --steer: it names the SAE whose features --steer sets.",
                                   param="sae")
        return None
    service = steering_service()
    sae_id = steered_sae(service, sae_ref(sae) if sae is not None else None, models_named(job, get_settings()))
    values = steer_assignments(steer, sae_id, "")  # sae_id given: the model id is not consulted
    return JobSteering(sae_id, check_values(values, int(service.sae(sae_id)["d_sae"]), "steer"))
