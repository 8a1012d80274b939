"""``millm models add|rm|pull`` on this machine, ``millm models load|unload|lock|unlock`` on a running server.

``add`` and ``rm`` edit the registry of paths (MILLM_HOME/models.json) that servers on this machine read;
``pull`` is the only command that touches the network (``millm.hub``); the server commands call
``/api/models`` with MILLM_ADMIN_KEY (else MILLM_API_KEY) as the Bearer key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import httpx
import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from cli.common import err, out, reports_errors
from millm.config import get_settings
from millm.errors import InvalidParameter, MillmError, ModelNotFound
from millm.paths import user_path

DEFAULT_URL = "http://127.0.0.1:8000"
UrlOption = Annotated[str, typer.Option(help="The running `millm serve`; the key comes from MILLM_ADMIN_KEY, else "
                                             "MILLM_API_KEY.")]
IdArgument = Annotated[str, typer.Argument(help="Model id (see `millm models list`).", show_default=False)]


def register(models_app: typer.Typer) -> None:
    models_app.command("add")(models_add)
    models_app.command("rm")(models_rm)
    models_app.command("pull")(models_pull)
    for action in ("load", "unload", "lock", "unlock"):
        models_app.command(action)(_server_command(action))


@reports_errors
def models_add(
    path: Annotated[Path, typer.Argument(help="A checkpoint directory (with config.json) or a "
                                              "<repo>.<QUANT>.gguf file.", show_default=False)],
    model_id: Annotated[str | None, typer.Option("--id", help="Id to register it under (default: the directory "
                                                              "name, or repo:QUANT for a GGUF file).")] = None,
) -> None:
    """Register a model by path, so a server on this machine loads it by id (nothing is copied)."""
    from millm.registry import register_path

    path = user_path(path)
    if not path.exists():
        raise InvalidParameter(f"{path} does not exist.", param="path")
    try:
        entry = register_path(path, get_settings(), model_id)
    except ModelNotFound:
        raise InvalidParameter(f"{path} is neither a checkpoint directory (with config.json) nor a "
                               "<repo>.<QUANT>.gguf file.", param="path") from None
    out.print(f"added {entry.id} ({entry.engine}{_quant(entry.quantization)}) at {entry.path}", markup=False)


@reports_errors
def models_rm(model_id: IdArgument) -> None:
    """Forget a model added with `millm models add` (its files are never touched)."""
    from millm.registry import list_models, unregister

    settings = get_settings()
    if unregister(model_id, settings):
        out.print(f"removed {model_id} (its files are untouched)", markup=False)
        return
    entry = next((e for e in list_models(settings) if e.id == model_id), None)
    if entry is None:
        raise ModelNotFound(model_id)
    where = {"bundled": "the bundled model",
             "hf-cache": f"in the local HuggingFace cache ({entry.path})"}.get(entry.source, f"in {entry.path}")
    raise InvalidParameter(f"'{model_id}' is {where}, not added with `millm models add`; only added models can be "
                           "removed.", param="model")


@reports_errors
def models_pull(
    spec: Annotated[str, typer.Argument(metavar="REPO[:QUANT]", show_default=False,
                                        help="owner/name for a whole checkpoint (safetensors), or owner/name:QUANT "
                                             "for one GGUF file, e.g. bartowski/SmolLM2-135M-Instruct-GGUF:Q8_0.")],
    model_id: Annotated[str | None, typer.Option("--id", help="Id to pull it under (a checkpoint: the repo's name; "
                                                              "a GGUF file: ID:QUANT instead of its file name's).")]
    = None,
    revision: Annotated[str | None, typer.Option(help="Branch, tag or commit (default: the main branch).")] = None,
) -> None:
    """Download a model from the Hugging Face Hub into MILLM_HOME/models (resumable; HF_TOKEN for gated repos)."""
    from millm.hub import parse_spec, pull

    parsed = parse_spec(spec)
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=err) as progress:
        result = pull(parsed, get_settings(), model_id=model_id, revision=revision, progress=progress)
    entry = result.entry
    if result.downloaded:
        out.print(f"pulled {parsed.repo} at {result.commit[:8]}: {len(result.downloaded)} file(s) into {entry.path}",
                  markup=False)
    else:
        out.print(f"{parsed.repo} at {result.commit[:8]} is already in {entry.path}; nothing to download",
                  markup=False)
    out.print(f"id: {entry.id} (millm chat --model {entry.id})", markup=False)


def _quant(quantization: str | None) -> str:
    return f", {quantization}" if quantization else ""


def call_server(url: str, method: str, path: str) -> dict[str, Any]:
    """One /api call to a running server; its error body, or why it could not be reached, as a MillmError."""
    settings = get_settings()
    key = settings.admin_key or settings.api_key
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        response = httpx.request(method, url.rstrip("/") + path, headers=headers,
                                 timeout=httpx.Timeout(30.0, read=None))  # a load takes as long as it takes
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise MillmError(f"Cannot reach a miLLM server at {url} ({exc}).") from None
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.is_error:
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and "message" in error:
            raise MillmError(f"{error['message']} (HTTP {response.status_code} {error.get('code')})")
        raise MillmError(f"{method} {path}: HTTP {response.status_code} from {url}")
    if not isinstance(body, dict):
        raise MillmError(f"{method} {path}: {url} did not answer with JSON; is it a miLLM server?")
    return body


def _server_command(action: str) -> Any:
    """``millm models <action> ID --url``: POST /api/models/{id}/<action>, then print the model's state."""
    @reports_errors
    def command(model_id: IdArgument, url: UrlOption = DEFAULT_URL) -> None:
        with err.status(f"{action} {model_id} on {url} ..."):
            model = call_server(url, "POST", f"/api/models/{quote(model_id, safe='')}/{action}")
        locked = " (locked)" if model.get("locked") else ""
        out.print(f"{model['id']}: {model['state']}{locked}", markup=False)

    command.__doc__ = {
        "load": "Load a model on a running server in place of its loaded one (checked before anything unloads).",
        "unload": "Unload a model on a running server, if it is the loaded one.",
        "lock": "Lock a running server to one model for steering: /v1 serves only it until unlocked.",
        "unlock": "Lift the lock on a running server.",
    }[action]
    return command
