"""``millm batch``: an OpenAI batch file answered as the server would answer each line, resumable,
on this process or over a Ray cluster (``--ray``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cli.common import engine_for, err, reports_errors, steering_service
from millm.config import get_settings
from millm.errors import InvalidParameter

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
) -> None:
    """Answer every line of an OpenAI batch file as `millm serve` would; rerun to resume after a stop."""
    from millm.batch.answer import Answerer
    from millm.batch.run import open_job, write_answers

    check_counts(batch_size, workers)
    job = open_job(input, output)
    if ray is not None:
        from millm.batch.distributed import answer_on_ray, ray_session

        # connected first: no cluster at the address is one line and exit 1, before any work or progress bar
        with ray_session(ray_address(ray)), progress_bar("batch (ray)", len(job.lines), job.done) as advance:
            answer_on_ray(job, output, steering_service(), get_settings(), ray_address(ray), workers, batch_size,
                          advance)
    else:
        answerer = Answerer(lambda entry: engine_for(entry.id), steering_service(), get_settings(), job.created)
        with output.open("a", encoding="utf-8") as sink, progress_bar("batch", len(job.lines), job.done) as advance:
            write_answers(answerer, job.todo, sink, batch_size, advance)
    err.print(f"answered {len(job.todo)} lines ({job.done} already done) -> {output}")
