"""A batch job on one process: read the input, skip what the output already answers, answer the rest in
chunks, append each chunk's lines in input order as soon as it is answered."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from millm.batch.answer import Answerer
from millm.batch.lines import BatchLine, output_line, parse_lines
from millm.batch.resume import batch_key, keep_whole_lines, pending
from millm.errors import InvalidParameter
from millm.paths import output_file, user_path

Progress = Callable[[int, int], None]  # rows answered, tokens in them


@dataclass(frozen=True)
class BatchJob:
    """An input file read and matched against its output: every line, and those still to answer."""

    lines: list[BatchLine]
    todo: list[BatchLine]
    created: int  # every completion body's ``created``: when the input file was last written

    @property
    def done(self) -> int:
        return len(self.lines) - len(self.todo)


def read_lines(path: Path, name: str = "input") -> list[str]:
    """The file's lines, split at ``\n`` only: JSONL lines end there, while U+2028, U+0085 and the other
    breaks ``str.splitlines`` knows are ordinary characters inside a JSON string."""
    try:
        return user_path(path).read_text(encoding="utf-8", errors="surrogateescape").split("\n")
    except OSError as exc:
        raise InvalidParameter(f"{path}: {exc.strerror}.", param=name) from None


def open_job(input: Path, output: Path) -> BatchJob:
    """Parse ``input``; cut a torn last line off ``output`` and leave out the lines it already answers.

    An output that holds anything but batch output lines is refused, never emptied."""
    if input.resolve() == output.resolve():
        raise InvalidParameter("The output file must not be the input file.", param="output")
    output = output_file(output, "output")
    lines = parse_lines(read_lines(input))
    try:
        done = keep_whole_lines(output, batch_key)
    except OSError as exc:
        raise InvalidParameter(f"{output}: {exc.strerror}.", param="output") from None
    return BatchJob(lines, pending(lines, lambda line: line.key, done), int(input.stat().st_mtime))


def write_answers(answerer: Answerer, todo: list[BatchLine], sink: IO[str], batch_size: int,
                  progress: Progress | None = None) -> None:
    """Answer ``todo`` ``batch_size`` lines at a time, writing and flushing each chunk in input order."""
    for start in range(0, len(todo), batch_size):
        answers = answerer.answer(todo[start:start + batch_size])
        sink.write("".join(output_line(a) for a in answers))
        sink.flush()
        if progress is not None:
            progress(len(answers), sum(a.tokens for a in answers))
