"""What every ``millm`` command shares: consoles, the error boundary, the loaded engine.

Heavy modules (torch, transformers, llama.cpp) are imported inside the commands that need them,
so ``millm --help`` answers at once.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.console import Console

from millm import local
from millm.config import get_settings
from millm.errors import InvalidParameter, MillmError
from millm.local import ENGINES as _engines
from millm.local import steering_service as steering_service

if TYPE_CHECKING:
    from millm.engine.base import Engine
    from millm.steering.target import SteeringTarget

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])


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


def engine_of(model: str) -> str:
    """Which engine runs ``model`` (an id, a GGUF repo name or a path), without loading it."""
    from millm.registry import resolve

    return resolve(model, get_settings(), paths=True).engine


def engine_for(model: str | None) -> Engine:
    """The engine for ``model`` (default: the configured default), loaded once per process with a spinner,
    its persisted SAE attachments and steering values re-applied (``millm.local``)."""
    return local.engine_for(model, lambda model_id: err.status(f"loading {model_id} ..."))


def steerable(engine: Engine) -> SteeringTarget:
    """The engine's steering, or a clear error for an engine that has none."""
    target = engine.steering_target()
    if target is None:
        raise InvalidParameter(f"'{engine.model_id}' runs on {engine.engine_name}, which cannot be steered.",
                               param="model")
    return target


def sae_ref(ref: str) -> str:
    """The id of the registered SAE ``ref`` names: by id (bundled SAEs' ids are their names, as are those of
    ``millm sae train --name``), or by the name it was registered under (``millm sae add --name``); a name
    several SAEs share is refused listing their ids. Every CLI option and argument that takes an SAE goes
    through here."""
    from millm.errors import SAENotFound
    from millm.sae.bundled import register_bundled

    service = steering_service()
    register_bundled(service.store)
    if service.store.sae(ref) is not None:
        return ref
    named = [r["id"] for r in service.store.saes() if r["name"] == ref]
    if len(named) > 1:
        raise InvalidParameter(f"'{ref}' names {len(named)} SAEs ({', '.join(named)}); give its id.", param="sae")
    if not named:
        raise SAENotFound(f"No SAE has id or name '{ref}'; see `millm sae list`.", param="sae")
    return str(named[0])


def loaded_ids() -> set[str]:
    return set(_engines)
