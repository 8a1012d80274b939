"""``millm``: chat, embed and list models from the terminal."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from cli import batch as batch_cli
from cli import documents as documents_cli
from cli import models as models_cli
from cli import score as score_cli
from cli import steering as steering_cli
from cli.common import (
    WEIGHTS_HELP,
    Weights,
    engine_for,
    engine_of,
    err,
    loaded_ids,
    out,
    read_stdin,
    reports_errors,
    sae_ref,
    steerable,
    steering_service,
    use_weights,
)
from cli.probes import probes_app
from cli.sae_train import steer_assignments
from cli.vectors import vectors_app
from millm.config import get_settings
from millm.errors import InvalidParameter, MillmError
from millm.steering.session import SteeredChat, chat_steering, profile_unfit

if TYPE_CHECKING:
    from millm.engine.base import Engine
    from millm.requests.generation import Prepared
    from millm.steering.core import RequestSteering, SteeringCore
    from millm.steering.target import SteeringTarget

app = typer.Typer(help="miLLM: run a local language model, steer it by SAE features, serve it over OpenAI's API.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
models_app = typer.Typer(help="Models on this machine.", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(vectors_app, name="vectors")
app.add_typer(probes_app, name="probes")
models_cli.register(models_app)
steering_cli.register(app)
documents_cli.register(app)
app.command()(score_cli.score)
app.command()(batch_cli.batch)


def chat_body(model: str, messages: list[dict[str, Any]], fields: dict[str, Any]) -> dict[str, Any]:
    """The /v1/chat/completions body these CLI options stand for (unset options are left out)."""
    return {"model": model, "messages": messages, **{k: v for k, v in fields.items() if v is not None}}


def stream_answer(engine: Engine, messages: list[dict[str, Any]], fields: dict[str, Any],
                  chat: SteeredChat | None = None) -> str:
    """Print the answer as it is generated; return its full text. Prepared as the server prepares a
    request (``millm.requests.generation.prepare``: the same limits), steered as ``chat`` decided; one line on
    stderr says what steered it."""
    from millm.engine.decode.driver import run
    from millm.engine.events import Delta, Finish
    from millm.requests.builder import build_chat
    from millm.requests.generation import prepare
    from millm.requests.limits import Limits

    chat = chat or SteeredChat()
    built = build_chat(chat_body(engine.model_id, messages, fields), lambda _: engine.engine_name)
    prepared = prepare(engine, built, Limits.of(get_settings()), steering=chat.steering)
    err.print(steering_line(engine, prepared, chat), markup=False)
    pieces = []
    finish = None
    for event in run(engine, prepared.plans):  # the decode loop's driver: failures typed as the server's
        if isinstance(event, Delta):
            pieces.append(event.text)
            out.print(event.text, end="", markup=False)
        elif isinstance(event, Finish):
            finish = event.reason
    out.print()
    if finish == "length":
        err.print("[dim](stopped at max_tokens)[/]")
    return "".join(pieces)


SHOWN_FEATURES = 8  # per SAE on the steering line; the rest are counted


def steering_line(engine: Engine, prepared: Prepared, chat: SteeredChat) -> str:
    """What steered an answer, as X-miLLM-Steering says it but in full: the name (``prepared.label``) and the
    values (its own the answer was prepared with, else the live values its hooks hold) per SAE and
    layer, each feature with its label; or ``none`` and why."""
    target = engine.steering_target()
    if target is None:
        why = " without MILLM_GGUF_STEERING=true" if engine.engine_name == "llama.cpp" else ""
        return f"steering: none ({engine.model_id} runs on {engine.engine_name}, which is not steered{why})"
    steering = target.steering
    aside = f"; {', '.join(chat.set_aside)} set aside for this chat" if chat.set_aside else ""
    if prepared.label == "none":
        return f"steering: none ({why_unsteered(target, prepared, chat)}{aside})"
    if chat.unfit is not None:  # the dial went to the live values instead of the active profile
        aside += f"; {chat.unfit}"
    own = prepared.steering.values
    values = own if own is not None else {a.sae_id: a.values for a in steering.attachments.values()}
    parts = [part for sae_id, features in values.items()
             if (part := _steered_part(target, sae_id, features)) is not None]
    return f"steering: {_source(prepared, chat)} {'; '.join(parts)}{aside}"


def _source(prepared: Prepared, chat: SteeredChat) -> str:
    """What the steering line says steered an answer: a profile (and what backs it), or the values."""
    from millm.steering.core import LIVE

    if prepared.label != LIVE:
        backing = steering_service().store.backing(prepared.label)
        source = f'profile "{prepared.label}"' + (f" ({backing})" if backing else "")
    else:
        source = "this chat's values" if chat.own else "live values"
    if prepared.steering.echo is not None:
        source += f" at intensity {prepared.steering.echo}"
    if prepared.steering.rung is not None:
        source += f", circuit rung {prepared.steering.rung}"
    if prepared.scope != "all":
        source += f" ({prepared.scope} positions only)"
    return source


def _steered_part(target: SteeringTarget, sae_id: str, features: Mapping[int, float]) -> str | None:
    """One attached SAE's steered features with their labels (the first SHOWN_FEATURES), or None."""
    steered = sorted((f, s) for f, s in features.items() if s)
    if not steered or sae_id not in target.steering.attachments:
        return None
    labels = steering_service().store.label_map(sae_id)
    shown = [f'{f} "{labels[f]}" = {s:g}' if f in labels else f"{f} = {s:g}" for f, s in steered[:SHOWN_FEATURES]]
    more = f" and {len(steered) - SHOWN_FEATURES} more" if len(steered) > SHOWN_FEATURES else ""
    return f"on {sae_id} (L{target.steering.attachments[sae_id].layer}): {', '.join(shown)}{more}"


def _unattached_reason(steering: SteeringCore, decided: RequestSteering) -> str:
    """Why nothing steered with no SAE attached: the named profile's own unfitness, when it says one, else that."""
    from millm.steering.core import LIVE

    named = decided.name if decided.values is not None and decided.name != LIVE else None
    unfit = profile_unfit(steering_service(), steering, named) if named is not None else None
    return unfit or "no SAE attached"


def _live_reason(steering: SteeringCore) -> str:
    """Why the live values steered nothing: steering is disabled while some are set, else none are."""
    if not steering.enabled and any(a.values for a in steering.attachments.values()):
        return "steering is disabled"
    return "no live values on the attached SAEs"


def why_unsteered(target: SteeringTarget, prepared: Prepared, chat: SteeredChat) -> str:
    """Why an answer whose X-miLLM-Steering is ``none`` ran unsteered."""
    from millm.steering.core import LIVE

    steering, decided = target.steering, prepared.steering
    if chat.unfit is not None:
        return chat.unfit
    if not steering.attachments:
        return _unattached_reason(steering, decided)
    if decided.values is None:
        return _live_reason(steering)
    if decided.echo is not None and float(decided.echo) == 0.0:
        return "intensity off"
    if decided.name != LIVE:
        return f'profile "{decided.name}" steers nothing through the attached SAEs'
    return "every strength of this chat is 0" if chat.own else "no live values on the attached SAEs"


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
    sae: Annotated[str | None, typer.Option(help="SAE id to steer this chat through, attached for it only; an SAE "
                                                 "already on its layer is set aside meanwhile.")] = None,
    layer: Annotated[int | None, typer.Option(help="Layer for --sae (default: where it is attached, else its "
                                                   "layer hint).")] = None,
    steer: Annotated[list[str] | None, typer.Option(help="FEATURE=STRENGTH on --sae, or the one attached SAE; "
                                                          "FEATURE is an index or a label such as weather; "
                                                          "FEATURE alone takes its recommended strength "
                                                          "(repeatable).")] = None,
    steer_concept: Annotated[str | None, typer.Option(help="Steer by a concept word: the vector set concept-WORD at "
                                                           "its recommended strength, learned and calibrated now "
                                                           "when there is none (then stored for next time).")
                             ] = None,
    profile: Annotated[str | None, typer.Option(help="Saved profile to steer this chat with.")] = None,
    intensity: Annotated[str | None, typer.Option(help="Steering dial for this chat: a λ from 0 to 2, or off, min, "
                                                       "max; scales --profile, else the active profile, else the "
                                                       "live values.")] = None,
    scope: Annotated[str | None, typer.Option(help="Where steering applies: all (default), generated (only the "
                                                   "answer's tokens) or prompt (only the prompt's).")] = None,
    weights: Annotated[Weights | None, typer.Option(help=WEIGHTS_HELP)] = None,
) -> None:
    """Chat with a model: one answer, stdin, or an interactive session (/reset, /exit). Each answer goes to
    stdout; one line on stderr says what steered it."""
    from millm.requests.builder import build_chat

    use_weights(weights)
    fields = {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens, "seed": seed, "stop": stop,
              "steering_intensity": dial_value(intensity), "steering_scope": scope}
    if steer_concept is not None:
        sae, steer = concept_steering(steer_concept, sae, steer, model)
    sae = sae_ref(sae) if sae is not None else None
    assignments = steer_assignments(steer or [], sae, model or get_settings().default_model)  # names via labels
    preamble = [{"role": "system", "content": system}] if system else []
    if prompt is None and not interactive and not sys.stdin.isatty():
        prompt = read_stdin("prompt")
    name = model or get_settings().default_model
    first = preamble + [{"role": "user", "content": prompt if prompt is not None else "?"}]
    built = build_chat(chat_body(name, first, fields), engine_of)  # refuse bad values before loading anything
    engine = engine_for(model)
    if sae is None and not assignments and profile is None and built.intensity is None:
        run_chat(engine, prompt, preamble, fields, SteeredChat())
        return
    with chat_steering(steering_service(), steerable(engine), sae, layer, assignments, profile,
                       built.intensity) as steered:
        run_chat(engine, prompt, preamble, fields, steered)


def concept_steering(word: str, sae: str | None, steer: list[str] | None,
                     model: str | None) -> tuple[str, list[str]]:
    """``--steer-concept WORD``: the vector set it steers by (``cli.vectors.concept_set``) and its name alone as
    the steering (its recommended strength); refused beside --sae or --steer."""
    from cli.vectors import concept_set

    if sae is not None or steer:
        raise InvalidParameter("--steer-concept picks its own vector set and strength: give it without --sae and "
                               "--steer.", param="steer_concept")
    name = concept_set(word, model)
    return name, [name]


def dial_value(text: str | None) -> float | str | None:
    """``--intensity`` as steering_intensity takes it: a number, or the word given (checked by the builder)."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return text


def run_chat(engine: Engine, prompt: str | None, preamble: list[dict[str, Any]], fields: dict[str, Any],
             chat: SteeredChat) -> None:
    if prompt is not None:
        stream_answer(engine, preamble + [{"role": "user", "content": prompt}], fields, chat)
    else:
        converse(engine, preamble, fields, chat)


def converse(engine: Engine, preamble: list[dict[str, Any]], fields: dict[str, Any],
             chat: SteeredChat) -> None:
    """The interactive loop: history kept until /reset, left with /exit or end of input."""
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
            answer = stream_answer(engine, history, fields, chat)
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
    from millm.requests.builder import build_embedding

    name = model or get_settings().default_model
    built = build_embedding({"model": name, "input": texts}, engine_of)
    vectors, _ = engine_for(model).embed(built.embed_inputs)
    out.print(json.dumps(vectors), markup=False)


@app.command()
@reports_errors
def serve(
    host: Annotated[str, typer.Option(help="Address to bind; loopback unless you mean otherwise.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    model: Annotated[str | None, typer.Option(help="Model to load at start (default: the bundled one).")] = None,
    batching: Annotated[bool, typer.Option("--batching", help="Continuous batching of generations (as "
                                           "MILLM_BATCHING=true).")] = False,
    no_console: Annotated[bool, typer.Option("--no-console", help="Serve no web console at / (as "
                                             "MILLM_CONSOLE=false).")] = False,
    weights: Annotated[Weights | None, typer.Option(help=WEIGHTS_HELP)] = None,
) -> None:
    """Serve the OpenAI-compatible /v1 API, the management API and the web console with Hypercorn."""
    import logging

    from millm.server.app import create_app
    from millm.server.run import is_loopback, run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    use_weights(weights)
    settings = get_settings()
    if batching:
        settings = settings.model_copy(update={"batching": True})
    if no_console:
        settings = settings.model_copy(update={"console": False})
    engine = engine_for(model)
    app = create_app(settings, engine)
    shown = f"[{host}]" if ":" in host else host
    err.print(f"miLLM serving [bold]{engine.model_id}[/] ({engine.fingerprint}) at http://{shown}:{port}/v1"
              f"{' - API key required' if settings.api_key else ''}")
    if settings.console:
        err.print(f"console: http://{shown}:{port}/", markup=False)
    if not is_loopback(host) and not settings.api_key:
        err.print(f"[yellow]warning:[/] bound to {host} beyond loopback with no MILLM_API_KEY: anyone who can "
                  "reach this port can use the API.")
    run(app, host, port)


@app.command()
@reports_errors
def tui(
    model: Annotated[str | None, typer.Option(help="Model to load in-process, or to chat with on --url.")] = None,
    url: Annotated[str | None, typer.Option(help="Drive a running `millm serve` (e.g. http://127.0.0.1:8000) "
                                                 "instead; keys from MILLM_API_KEY / MILLM_ADMIN_KEY.")] = None,
) -> None:
    """The live steering dial in the terminal: features, strengths, λ, chat, compare (F1 lists the keys)."""
    from tui.app import run as run_tui

    run_tui(model=model, url=url)


@models_app.command("list")
@reports_errors
def models_list() -> None:
    """Models on this machine: id, engine, source, size on disk, state."""
    from millm.registry import list_models

    table = Table("id", "engine", "source", "size", "state")
    for entry in list_models(get_settings()):
        state = "LOADED" if entry.id in loaded_ids() else "READY"
        table.add_row(entry.id, entry.engine, entry.source, f"{entry.size_bytes() / 2**20:.1f} MiB", state)
    out.print(table)


def main() -> None:
    app()
