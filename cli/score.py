"""``millm score``: next-token probabilities for a JSONL file of prompts, in batches, resumable."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cli.batch import RayOption, WorkersOption, check_counts, progress_bar, ray_address
from cli.common import engine_for, engine_of, err, reports_errors
from millm.config import get_settings
from millm.errors import InvalidParameter, MillmError
from millm.paths import output_file, user_path

if TYPE_CHECKING:
    from millm.engine.base import Engine
    from millm.engine.scoring import ScoreResult, ScoreRow, ScoringParams

ROW_FIELDS = ("allowed_tokens", "logprobs", "temperature")
TOKEN_ID = re.compile(r"-?[0-9]+")  # ASCII digits: str.isdigit() takes "²", which int() refuses


def allowed_ids(engine: Engine, items: list[Any]) -> list[Any]:
    """Allowed tokens given as ids or as strings that are exactly one token each."""
    from millm.engine.params import TextPrompt

    ids = []
    for item in items:
        if isinstance(item, str):
            found = engine.tokenize(TextPrompt(item, add_special_tokens=False))
            if len(found) != 1:
                raise InvalidParameter(f"Allowed token {item!r} is {len(found)} tokens, not one; give its id.",
                                       param="allowed_tokens")
            ids.append(found[0])
        else:
            ids.append(item)
    return ids


def _row_params(engine: Engine | None, row: dict[str, Any], defaults: dict[str, Any]) -> ScoringParams:
    """A row's scoring parameters: its own allowed tokens, logprobs and temperature, else the options'; allowed
    tokens given as text are resolved to ids only with an engine (without one they are left out)."""
    from millm.requests.builder import completion_scoring_params

    merged = {**defaults, **{k: row[k] for k in ROW_FIELDS if k in row}}
    allowed = merged.get("allowed_tokens") or None
    if allowed is not None and engine is not None:
        allowed = allowed_ids(engine, allowed)
    return completion_scoring_params({"logprobs": merged.get("logprobs", 5), "temperature": merged.get("temperature"),
                                      "allowed_token_ids": allowed if engine is not None else None})


def _prompt_row(row: dict[str, Any], params: ScoringParams) -> ScoreRow:
    """A row of a text ``prompt`` (and ``add_special_tokens``, true unless it says false) as a scoring row."""
    from millm.engine.params import TextPrompt
    from millm.engine.scoring import ScoreRow

    if not isinstance(row.get("prompt"), str):
        raise InvalidParameter("each line needs 'prompt' (a string) or 'messages' (a list).", param="prompt")
    special = row.get("add_special_tokens", True)
    if not isinstance(special, bool):
        raise InvalidParameter("'add_special_tokens' must be true or false.", param="add_special_tokens")
    return ScoreRow(TextPrompt(row["prompt"], special), params, "prompt")


def score_row_of(engine: Engine | None, row: Any, defaults: dict[str, Any]) -> ScoreRow:
    """One line of the input file as a scoring row, checked by the same rules as the server's requests.

    Without an engine (the up-front check of the options) allowed tokens given as text are not resolved.
    """
    from millm.engine.params import ChatPrompt
    from millm.engine.scoring import ScoreRow
    from millm.requests.validation import check_messages

    if not isinstance(row, dict):
        raise InvalidParameter("a line must be a JSON object.")
    params = _row_params(engine, row, defaults)
    if "messages" in row:
        return ScoreRow(ChatPrompt(check_messages(row["messages"])), params, "messages")
    return _prompt_row(row, params)


def result_line(engine: Engine, index: int, result: ScoreResult) -> dict[str, Any]:
    text = engine.token_text
    return {"row": index, "text": text(result.chosen.token_id), "token_id": result.chosen.token_id,
            "logprob": result.chosen.logprob,
            "top": [{"token": text(s.token_id), "token_id": s.token_id, "logprob": s.logprob,
                     "prob": math.exp(s.logprob)} for s in result.top]}


def done_rows(output: Path) -> set[int]:
    """Rows already written by an earlier run (a torn last line is ignored and rewritten)."""
    done: set[int] = set()
    if not output.exists():
        return done
    lines = output.read_text().splitlines(keepends=True)
    good = []
    for line in lines:
        try:
            done.add(json.loads(line)["row"])
            good.append(line)
        except (json.JSONDecodeError, KeyError, TypeError):
            break
    output.write_text("".join(good))
    return done


def _read_lines(input: Path) -> list[str]:
    """The input file's lines (UTF-8); a file that cannot be read is a refusal naming it."""
    try:
        return user_path(input).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidParameter(f"{input}: {getattr(exc, 'strerror', None) or 'not UTF-8 text'}.",
                               param="input") from None


@reports_errors
def score(
    input: Annotated[Path, typer.Argument(help="JSONL: one {\"prompt\": ...} or {\"messages\": [...]} per line.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="JSONL of results, one line per input line.")],
    model: Annotated[str | None, typer.Option(help="Model id (transformers engine).")] = None,
    allowed: Annotated[list[str] | None, typer.Option("--allowed", help="Allowed token: id or single-token text "
                                                                          "(repeatable).")] = None,
    logprobs: Annotated[int, typer.Option(help="Alternatives to report, 0-20.")] = 5,
    temperature: Annotated[float, typer.Option(help="Divides the logits; 0 = no scaling.")] = 1.0,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Prompts per forward pass.")] = 32,
    ray: RayOption = None,
    workers: WorkersOption = 1,
) -> None:
    """Score the next token of every line (never steered); rows already in OUTPUT are skipped."""
    check_counts(batch_size, workers)
    defaults = {"allowed_tokens": [int(a) if TOKEN_ID.fullmatch(a) else a for a in allowed or []],
                "logprobs": logprobs, "temperature": temperature}
    score_row_of(None, {"prompt": "-"}, defaults)  # the options obey the server's rules, checked before loading
    output = output_file(output, "output")
    lines = _read_lines(input)
    if ray is not None:
        score_on_ray(lines, output, model, defaults, ray_address(ray), workers, batch_size)
        return
    score_here(lines, output, model, defaults, batch_size)


def score_here(lines: list[str], output: Path, model: str | None, defaults: dict[str, Any], batch_size: int) -> None:
    """The pending rows on this machine's engine, in batches, appended to ``output`` in input order."""
    engine = engine_for(model)
    check_scorable(engine)
    done = done_rows(output)
    todo = [i for i in range(len(lines)) if i not in done]
    with output.open("a") as sink, Progress(TextColumn("scoring"), BarColumn(), MofNCompleteColumn(),
                                            TextColumn("{task.fields[rate]} rows/s"), TimeElapsedColumn(),
                                            console=err) as progress:
        task = progress.add_task("score", total=len(lines), completed=len(done), rate="-")
        for start in range(0, len(todo), batch_size):
            write_batch(engine, lines, todo[start:start + batch_size], defaults, sink)
            progress.advance(task, len(todo[start:start + batch_size]))
            elapsed = progress.tasks[0].elapsed or 1e-9
            progress.update(task, rate=f"{(start + len(todo[start:start + batch_size])) / elapsed:.1f}")
    err.print(f"scored {len(todo)} rows ({len(done)} already done) -> {output}")


def check_scorable(engine: Engine) -> None:
    if not engine.capabilities.scores:
        raise InvalidParameter(f"'{engine.model_id}' runs on {engine.engine_name}, which exposes no next-token "
                               "distribution here; score with a transformers model.", param="model")


def write_batch(engine: Engine, lines: list[str], indices: list[int], defaults: dict[str, Any],
                sink: Any) -> None:
    """Score one batch and write its lines in input order."""
    sink.write("".join(score_lines(engine, {i: lines[i] for i in indices}, defaults)))
    sink.flush()


def _parsed_rows(engine: Engine, lines: dict[int, str],
                 defaults: dict[str, Any]) -> tuple[list[tuple[int, ScoreRow]], dict[int, dict[str, Any]]]:
    """The lines that read as scoring rows, by row number, and an error line for each that does not."""
    ready: list[tuple[int, ScoreRow]] = []
    errors: dict[int, dict[str, Any]] = {}
    for i, line in lines.items():
        try:
            ready.append((i, score_row_of(engine, json.loads(line), defaults)))
        except (json.JSONDecodeError, MillmError) as exc:
            errors[i] = {"row": i, "error": getattr(exc, "message", str(exc))}
    return ready, errors


def _scored(engine: Engine, ready: list[tuple[int, ScoreRow]]) -> dict[int, dict[str, Any]]:
    """Result lines for ``ready`` rows, scored as one batch; when the batch fails, one by one, so a bad row gets
    an error line and the others their results."""
    from millm.engine.scoring import ScoreRequest

    if not ready:
        return {}
    try:
        scored = engine.score(ScoreRequest([row for _, row in ready], batch_size=len(ready)))
        return {i: result_line(engine, i, r) for (i, _), r in zip(ready, scored)}
    except MillmError:  # one bad row in the batch: score its rows one by one to isolate it
        results: dict[int, dict[str, Any]] = {}
        for i, row in ready:
            try:
                results[i] = result_line(engine, i, engine.score(ScoreRequest([row]))[0])
            except MillmError as exc:
                results[i] = {"row": i, "error": exc.message}
        return results


def score_lines(engine: Engine, lines: dict[int, str], defaults: dict[str, Any]) -> list[str]:
    """Output lines for one batch of input lines (by row number); a bad row gets an error line and the
    others go on."""
    ready, results = _parsed_rows(engine, lines, defaults)
    results |= _scored(engine, ready)
    return [json.dumps(results[i]) + "\n" for i in lines]


class ScoreWorker:
    """One Ray actor of a ``millm score --ray`` job: its own engine for the model, scoring its batches."""

    def __init__(self, model: list[Any], defaults: list[Any], threads: list[Any]) -> None:
        from millm.batch.distributed import match_threads, shipped

        match_threads(threads)
        from millm.engine import load_engine
        from millm.registry import resolve

        settings = get_settings()
        self.engine = load_engine(resolve(shipped(model), settings, paths=True), settings)
        check_scorable(self.engine)
        self.defaults = shipped(defaults)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        out = score_lines(self.engine, {int(i): str(t) for i, t in zip(batch["index"], batch["line"])},
                          self.defaults)
        return {"out": np.array(out, dtype=object), "tokens": np.zeros(len(out), dtype=np.int64)}


def score_on_ray(lines: list[str], output: Path, model: str | None, defaults: dict[str, Any], address: str | None,
                 workers: int, batch_size: int) -> None:
    """The pending rows over Ray (one engine per actor), appended to ``output`` in input order."""
    from millm.batch.distributed import ray_session, require_ray, run_rows

    require_ray()
    name = model or get_settings().default_model
    if engine_of(name) != "transformers":
        raise InvalidParameter(f"'{name}' does not run on transformers, which scoring needs.", param="model")
    done = done_rows(output)
    todo = [(i, lines[i]) for i in range(len(lines)) if i not in done]
    # connected first, as batch is: no cluster at the address is one line, before the progress bar
    with (ray_session(address), output.open("a") as sink,
          progress_bar("scoring (ray)", len(lines), len(done)) as advance):
        def write(line: str) -> None:
            sink.write(line)
            sink.flush()

        run_rows(todo, ScoreWorker, {"model": name, "defaults": defaults}, address, workers, batch_size, write,
                 advance)
    err.print(f"scored {len(todo)} rows ({len(done)} already done) -> {output}")
