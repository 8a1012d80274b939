"""``millm score``: next-token probabilities for a JSONL file of prompts, in batches, resumable."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cli.common import engine_for, err, reports_errors
from millm.engine import TransformersEngine
from millm.engine.params import ChatPrompt
from millm.engine.scoring import (ScoreResult, ScoringParams, check_allowed, check_temperature, check_top_n,
                                  score_row)
from millm.engine.templates import has_chat_template
from millm.errors import InvalidParameter, InvalidScoringRequest, MillmError, NoChatTemplate
from millm.validation import check_messages


def allowed_ids(engine: TransformersEngine, items: list[Any]) -> tuple[int, ...]:
    """Allowed tokens given as ids or as strings that are exactly one token each."""
    ids = []
    for item in items:
        if isinstance(item, str):
            found = engine.tokenizer(item, add_special_tokens=False)["input_ids"]
            if len(found) != 1:
                raise InvalidParameter(f"Allowed token {item!r} is {len(found)} tokens, not one; give its id.",
                                       param="allowed_tokens")
            ids.append(found[0])
        else:
            ids.append(item)
    return check_allowed(ids, len(engine.tokenizer))


def row_params(engine: TransformersEngine, row: dict[str, Any], defaults: dict[str, Any]) -> ScoringParams:
    merged = {**defaults, **{k: row[k] for k in ("allowed_tokens", "logprobs", "temperature") if k in row}}
    allowed = allowed_ids(engine, merged["allowed_tokens"]) if merged.get("allowed_tokens") else None
    top = check_top_n("logprobs", merged.get("logprobs", 5))
    return ScoringParams(allowed, check_temperature(merged.get("temperature")), len(allowed) if allowed else top, True)


def row_ids(engine: TransformersEngine, row: dict[str, Any]) -> list[int]:
    if "messages" in row:
        if not has_chat_template(engine.tokenizer):
            raise NoChatTemplate(f"'{engine.model_id}' has no chat template; give prompts instead of messages.")
        return engine.tokenize(ChatPrompt(check_messages(row["messages"])))
    if not isinstance(row.get("prompt"), str):
        raise InvalidParameter("each line needs 'prompt' (a string) or 'messages' (a list).", param="prompt")
    ids = engine.tokenizer(row["prompt"], add_special_tokens=row.get("add_special_tokens", True))["input_ids"]
    if not ids:
        raise InvalidScoringRequest("'prompt' tokenises to nothing; there is no position to score.", param="prompt")
    return ids


def result_line(engine: TransformersEngine, index: int, result: ScoreResult) -> dict[str, Any]:
    decode = engine.tokenizer.decode
    return {"row": index, "text": decode([result.chosen.token_id]), "token_id": result.chosen.token_id,
            "logprob": result.chosen.logprob,
            "top": [{"token": decode([s.token_id]), "token_id": s.token_id, "logprob": s.logprob,
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
) -> None:
    """Score the next token of every line (never steered); rows already in OUTPUT are skipped."""
    if batch_size < 1:
        raise InvalidParameter("--batch-size must be at least 1.", param="batch_size")
    defaults = {"allowed_tokens": [int(a) if a.lstrip("-").isdigit() else a for a in allowed or []],
                "logprobs": logprobs, "temperature": temperature}
    check_top_n("logprobs", logprobs)
    check_temperature(temperature)
    try:
        lines = input.read_text().splitlines()
    except OSError as exc:
        raise InvalidParameter(f"{input}: {exc.strerror}.", param="input") from None
    engine = engine_for(model)
    if engine.engine_name != "transformers":
        raise InvalidParameter(f"'{engine.model_id}' runs on llama.cpp, which exposes no next-token distribution "
                               "here; score with a transformers model.", param="model")
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


def write_batch(engine: TransformersEngine, lines: list[str], indices: list[int], defaults: dict[str, Any],
                sink: Any) -> None:
    """Score one batch; a bad row gets an error line and the others go on."""
    results: dict[int, dict[str, Any]] = {}
    ready: list[tuple[int, list[int], ScoringParams]] = []
    for i in indices:
        try:
            row = json.loads(lines[i])
            if not isinstance(row, dict):
                raise InvalidParameter("a line must be a JSON object.")
            ready.append((i, row_ids(engine, row), row_params(engine, row, defaults)))
        except (json.JSONDecodeError, MillmError) as exc:
            results[i] = {"row": i, "error": getattr(exc, "message", str(exc))}
    try:
        logits = engine.next_token_logits([ids for _, ids, _ in ready]) if ready else []
        for (i, _, params), row_logits in zip(ready, logits):
            try:
                results[i] = result_line(engine, i, score_row(row_logits, params))
            except MillmError as exc:
                results[i] = {"row": i, "error": exc.message}
    except MillmError:  # one bad prompt in the batch: score its rows one by one to isolate it
        for i, ids, params in ready:
            try:
                results[i] = result_line(engine, i, score_row(engine.next_token_logits([ids])[0], params))
            except MillmError as exc:
                results[i] = {"row": i, "error": exc.message}
    for i in indices:
        sink.write(json.dumps(results[i]) + "\n")
    sink.flush()
