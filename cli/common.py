"""What every ``millm`` command shares: consoles, the error boundary, the loaded engine.

Heavy modules (torch, transformers, llama.cpp) are imported inside the commands that need them,
so ``millm --help`` answers at once.

Every command gets its engine from ``engine_for``. ``ENGINE_FACTORY``, when set, is where that engine comes
from instead of loading a model: the tests hand the CLI the scripted engine this way (``tests/support/cli.py``),
so ``chat``, ``steer``, ``score``, ``batch`` and ``embed`` run without a model.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import typer
from rich.console import Console

from millm import local
from millm.config import get_settings
from millm.errors import InvalidParameter, MillmError
from millm.local import ENGINES as _engines
from millm.local import steering_service as steering_service
from millm.requests.jsonbody import is_utf8

if TYPE_CHECKING:
    from millm.engine.base import Engine
    from millm.steering.target import SteeringTarget

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])

EngineFactory = Callable[[str | None], "Engine"]  # a model name (None: the default) -> its engine
ENGINE_FACTORY: EngineFactory | None = None  # set: every command's engine comes from here, nothing is loaded


def reports_errors(fn: F) -> F:
    """The one place CLI errors become a clear line on stderr and a non-zero exit, never a traceback. Arguments
    are checked here first: one holding bytes that are not UTF-8 (the shell passes them through) is refused
    naming it, before any command reads it."""
    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            check_text_arguments(kwargs)
            return fn(*args, **kwargs)
        except MillmError as exc:
            err.print(f"[bold red]error:[/] {exc.message}", markup=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
    return wrapper  # type: ignore[return-value]


def check_text_arguments(arguments: dict[str, Any]) -> None:
    """Refuse an argument whose text holds bytes that are not UTF-8: Python keeps them as lone surrogates, which
    no tokenizer, JSON encoder or terminal takes."""
    for name, value in arguments.items():
        for text in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(text, str) and not is_utf8(text):
                option = name.replace("_", "-")
                raise InvalidParameter(f"'{option}' holds bytes that are not UTF-8 text.", param=option)


def read_stdin(option: str = "text") -> str:
    """Standard input as UTF-8 text; input that is not UTF-8 is refused naming ``option``."""
    import sys

    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidParameter(f"'{option}' from standard input is not UTF-8 text.", param=option) from None


def check_seed(seed: int, option: str = "seed") -> int:
    """A sampling seed in the range requests take (0 to 2**32 - 1)."""
    from millm.requests.validation import SEED_MAX, check_int

    return check_int(option, seed, low=0, high=SEED_MAX)


Weights = Literal["auto", "dtype", "int8"]  # --weights, as MILLM_WEIGHTS takes it
WEIGHTS_HELP = ("Linear weights (as MILLM_WEIGHTS): int8 (the decoder layers in 8 bits; transformers on the CPU "
                "only), dtype (as MILLM_DTYPE) or auto.")


def use_weights(weights: str | None) -> None:
    """``--weights``: MILLM_WEIGHTS for every load this process makes (nothing when not given). A value that cannot
    apply to the model is refused when it loads, naming ``weights``."""
    if weights is None:
        return
    import os

    os.environ["MILLM_WEIGHTS"] = weights
    get_settings.cache_clear()


def engine_of(model: str) -> str:
    """Which engine runs ``model`` (an id, a GGUF repo name or a path), without loading it (with an
    ``ENGINE_FACTORY``: the engine it hands out)."""
    from millm.registry import resolve

    if ENGINE_FACTORY is not None:
        return ENGINE_FACTORY(model).engine_name
    return resolve(model, get_settings(), paths=True).engine


def engine_for(model: str | None) -> Engine:
    """The engine for ``model`` (default: the configured default), loaded once per process with a spinner,
    its persisted SAE attachments and steering values re-applied (``millm.local``); or, with an
    ``ENGINE_FACTORY``, the one it hands out."""
    if ENGINE_FACTORY is not None:
        return ENGINE_FACTORY(model)
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
