"""``millm``: chat, embed and list models from the terminal."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import wraps
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from millm.config import get_settings
from millm.engine import TransformersEngine, load_engine
from millm.engine.events import Delta, Finish
from millm.engine.params import ChatPrompt, GenerationRequest
from millm.errors import MillmError
from millm.registry import list_models, resolve
from millm.validation import check_messages, check_prompt_text, sampling_params

app = typer.Typer(help="miLLM: run a local language model, steer it by SAE features, serve it over OpenAI's API.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
models_app = typer.Typer(help="Models on this machine.", no_args_is_help=True)
app.add_typer(models_app, name="models")

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])
_engines: dict[str, TransformersEngine] = {}


def reports_errors(fn: F) -> F:
    """The one place CLI errors become a clear line on stderr and a non-zero exit, never a traceback."""
    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MillmError as exc:
            err.print(f"[bold red]error:[/] {exc.message}", markup=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
    return wrapper  # type: ignore[return-value]


def engine_for(model: str | None) -> TransformersEngine:
    """The engine for ``model`` (default: the configured default), loaded once per process."""
    settings = get_settings()
    entry = resolve(model or settings.default_model, settings)
    if entry.id not in _engines:
        with err.status(f"loading {entry.id} ..."):
            _engines[entry.id] = load_engine(entry, settings)
    return _engines[entry.id]


def stream_answer(engine: TransformersEngine, messages: list[dict[str, Any]], fields: dict[str, Any]) -> str:
    """Print the answer as it is generated; return its full text."""
    request = GenerationRequest([ChatPrompt(check_messages(messages))], sampling_params(fields))
    pieces = []
    finish = None
    for event in engine.generate(request):
        if isinstance(event, Delta):
            pieces.append(event.text)
            out.print(event.text, end="", markup=False)
        elif isinstance(event, Finish):
            finish = event.reason
    out.print()
    if finish == "length":
        err.print("[dim](stopped at max_tokens)[/]")
    return "".join(pieces)


@app.command()
@reports_errors
def chat(
    prompt: Annotated[str | None, typer.Argument(help="Ask once and exit; omit for an interactive chat.")] = None,
    model: Annotated[str | None, typer.Option(help="Model id or checkpoint directory.")] = None,
    system: Annotated[str | None, typer.Option(help="System prompt.")] = None,
    temperature: Annotated[float | None, typer.Option(help="0 = greedy; 0-2.")] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", help="Nucleus sampling, 0-1.")] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", help="Most tokens to generate.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed for reproducible sampling.")] = None,
    stop: Annotated[list[str] | None, typer.Option(help="Stop sequence (repeatable).")] = None,
    interactive: Annotated[bool, typer.Option("--interactive", "-i",
                                              help="Chat turn by turn even when stdin is piped.")] = False,
) -> None:
    """Chat with a model: one answer, stdin, or an interactive session (/reset, /exit)."""
    fields = {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens, "seed": seed, "stop": stop}
    sampling_params(fields)  # refuse bad values before loading anything
    preamble = [{"role": "system", "content": system}] if system else []
    if prompt is None and not interactive and not sys.stdin.isatty():
        prompt = sys.stdin.read()
    if prompt is not None:
        check_prompt_text("prompt", prompt)
        stream_answer(engine_for(model), preamble + [{"role": "user", "content": prompt}], fields)
        return
    engine = engine_for(model)
    history = list(preamble)
    err.print(f"[dim]{engine.model_id} - /reset clears the history, /exit leaves[/]")
    while True:
        try:
            line = out.input("[bold cyan]you>[/] ")
        except EOFError:
            return
        if line.strip() == "/exit":
            return
        if line.strip() == "/reset":
            history = list(preamble)
            err.print("[dim]history cleared[/]")
            continue
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        try:
            answer = stream_answer(engine, history, fields)
        except MillmError:
            history.pop()
            raise
        history.append({"role": "assistant", "content": answer})


@app.command()
@reports_errors
def embed(
    texts: Annotated[list[str], typer.Argument(help="Texts to embed.")],
    model: Annotated[str | None, typer.Option(help="Model id or checkpoint directory.")] = None,
) -> None:
    """Print one embedding vector per text, as a JSON list of lists."""
    vectors, _ = engine_for(model).embed(texts)
    out.print(json.dumps(vectors), markup=False)


@app.command()
@reports_errors
def serve(
    host: Annotated[str, typer.Option(help="Address to bind; loopback unless you mean otherwise.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    model: Annotated[str | None, typer.Option(help="Model to load at start (default: the bundled one).")] = None,
) -> None:
    """Serve the OpenAI-compatible /v1 API and the management API with Hypercorn."""
    import logging

    from millm.server.app import create_app
    from millm.server.run import is_loopback, run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = get_settings()
    engine = engine_for(model)
    app = create_app(settings, engine)
    shown = f"[{host}]" if ":" in host else host
    err.print(f"miLLM serving [bold]{engine.model_id}[/] ({engine.fingerprint}) at http://{shown}:{port}/v1"
              f"{' - API key required' if settings.api_key else ''}")
    if not is_loopback(host) and not settings.api_key:
        err.print(f"[yellow]warning:[/] bound to {host} beyond loopback with no MILLM_API_KEY: anyone who can "
                  "reach this port can use the API.")
    run(app, host, port)


@models_app.command("list")
@reports_errors
def models_list() -> None:
    """Models on this machine: id, engine, source, size on disk, state."""
    table = Table("id", "engine", "source", "size", "state")
    for entry in list_models(get_settings()):
        state = "LOADED" if entry.id in _engines else "READY"
        table.add_row(entry.id, entry.engine, entry.source, f"{entry.size_bytes() / 2**20:.1f} MiB", state)
    out.print(table)


def main() -> None:
    app()
