"""``millm models pull``: a checkpoint or one GGUF file from the Hugging Face Hub into MILLM_HOME/models.

The only code in miLLM that touches the network, and only when a user asks for it. A checkpoint lands
in ``models/<id>/`` with ``config.json`` written last, so a half-pulled directory is never listed as a
model; one GGUF file lands as ``models/<name>.<QUANT>.gguf``, which ``millm.registry`` lists as
``<name>:QUANT``. Nothing else needs registering: ``list_models`` finds both.

Resuming: each file is fetched into a hidden ``.part`` file named by its ETag that outlives an
interrupted run (Ctrl-C, a dropped connection, a killed process); the next attempt, in this run or a
later one, asks only for the missing bytes (HTTP Range). huggingface_hub 1.x and later deletes its
partial files on failure, so the bytes are fetched here; the Hub's API (repo listing, file metadata,
redirects, the HF_TOKEN header) stays huggingface_hub's. A ledger, ``models/.pulled.json``, records the
repo, commit and ETag of every pulled file: pulling again downloads nothing unchanged, and a pull never
writes over files it did not put there.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import httpx
from rich.progress import Progress, TaskID

from millm.atomic import replace_text
from millm.config import Settings
from millm.errors import InvalidParameter, MillmError
from millm.registry import ModelEntry, check_model_id, entry_for_path, gguf_entry, list_models

CHECKPOINT_FILES = ("*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt", "*.jinja")
"""Top-level files a transformers checkpoint needs: config, weights, tokenizer, chat template."""
RETRIES = 5
"""Attempts after a dropped connection within one run, each resuming where the last one stopped."""
RETRY_WAIT = 1.0
LEDGER = ".pulled.json"
_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


@dataclass(frozen=True)
class PullSpec:
    """``REPO`` (a whole checkpoint) or ``REPO:QUANT`` (one GGUF file of that quantization)."""

    repo: str
    quant: str | None = None


@dataclass
class PullResult:
    """What a pull left on disk: the model's entry, the commit, and which files moved."""

    entry: ModelEntry
    commit: str
    downloaded: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


def parse_spec(text: str) -> PullSpec:
    """``owner/name`` or ``owner/name:QUANT``; a QUANT miLLM could not name (``Q4_K_M``, ``F16``...) is refused."""
    repo, colon, quant = text.partition(":")
    if not _REPO_ID.match(repo):
        raise InvalidParameter(f"'{text}' is not a Hub repository: give owner/name, or owner/name:QUANT for one "
                               "GGUF file.", param="repo")
    if not colon:
        return PullSpec(repo)
    if gguf_entry(Path(f"model.{quant}.gguf"), "path") is None:
        raise InvalidParameter(f"'{quant}' is not a GGUF quantization tag (such as Q4_K_M, Q8_0, IQ2_XS, F16, BF16).",
                               param="quant")
    return PullSpec(repo, quant)


def checkpoint_files(repo: str, files: list[str]) -> list[str]:
    """The files of a transformers checkpoint to fetch, ``config.json`` last (a repo without one is refused)."""
    top = [f for f in files if "/" not in f and any(PurePosixPath(f).match(p) for p in CHECKPOINT_FILES)]
    if "config.json" not in top:
        quants = gguf_quants(files)
        hint = f" It holds GGUF files: pull one with {repo}:QUANT ({', '.join(quants)})." if quants else ""
        raise InvalidParameter(f"{repo} has no config.json, so it is not a transformers checkpoint.{hint}",
                               param="repo")
    if not any(f.endswith(".safetensors") for f in top):
        raise InvalidParameter(f"{repo} has no .safetensors weights (miLLM pulls safetensors checkpoints only).",
                               param="repo")
    return sorted(top, key=lambda f: f == "config.json")


def _gguf_files(files: list[str]) -> list[str]:
    """Single-file GGUF weights (multimodal projectors left out)."""
    return [f for f in files if f.lower().endswith(".gguf") and not PurePosixPath(f).name.lower().startswith("mmproj")]


def gguf_quants(files: list[str]) -> list[str]:
    """The quantization tags of a repo's single-file GGUFs, as miLLM names them."""
    tags = {e.quantization for f in _gguf_files(files) if (e := gguf_entry(Path(PurePosixPath(f).name), "path"))}
    return sorted(t for t in tags if t)


def pick_gguf(repo: str, quant: str, files: list[str]) -> tuple[str, str]:
    """The repo file ``<name>.<QUANT>.gguf`` or ``<name>-<QUANT>.gguf`` (case-insensitive), and QUANT as the
    file spells it; a clear error listing the quantizations there are otherwise."""
    pattern = re.compile(rf"^.+[.-](?P<quant>{re.escape(quant)})\.gguf$", re.IGNORECASE)
    matches = [(f, m["quant"]) for f in _gguf_files(files) if (m := pattern.match(PurePosixPath(f).name))]
    top = [m for m in matches if "/" not in m[0]] or matches
    if len(top) == 1:
        return top[0]
    if top:
        raise InvalidParameter(f"{repo} has several {quant} files ({', '.join(f for f, _ in top)}); miLLM pulls "
                               "single-file GGUFs only.", param="quant")
    quants = gguf_quants(files)
    there = f"available: {', '.join(quants)}" if quants else "it has no single-file GGUF weights"
    raise InvalidParameter(f"{repo} has no {quant} GGUF file ({there}).", param="quant")


def _plain_name(name: str) -> str:
    if Path(name).name != name or name in (".", "..") or name.startswith(".") or ":" in name:
        raise InvalidParameter(f"'{name}' cannot name a model here: use letters, digits, '.', '-' and '_'.",
                               param="id")
    return check_model_id(name)  # the rule every model id follows (no CR/LF, NUL, route words, ...)


def _check_free(entry: ModelEntry, settings: Settings) -> None:
    """Refuse an id another model on this machine already has (the pulled one may replace itself)."""
    for other in list_models(settings):
        if other.id == entry.id and other.path != entry.path:
            raise InvalidParameter(f"The id '{entry.id}' is taken by the {other.source} model at {other.path}; "
                                   "pass --id to pull under another id.", param="id")


# the ledger of pulled files
def _read_ledger(settings: Settings) -> dict[str, Any]:
    try:
        data = json.loads((settings.models_dir / LEDGER).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_ledger(settings: Settings, ledger: dict[str, Any]) -> None:
    """Replace the ledger atomically (a killed write leaves the previous one)."""
    replace_text(settings.models_dir / LEDGER, json.dumps(ledger, indent=2))


# talking to the Hub
def _transport_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean the Hub could not be reached (huggingface_hub 1+ speaks httpx2, older ones requests)."""
    errors: list[type[BaseException]] = [httpx.TransportError]
    try:
        import httpx2

        errors.append(httpx2.TransportError)
    except ImportError:
        import requests

        errors.append(requests.RequestException)
    return tuple(errors)


@contextmanager
def _hub_errors(spec: PullSpec, revision: str | None, endpoint: str) -> Iterator[None]:
    """The Hub's failures as one clear line each (never a traceback)."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
    except OfflineModeIsEnabled:
        raise MillmError("HF_HUB_OFFLINE is set: unset it to pull from the Hub.") from None
    except GatedRepoError:
        raise InvalidParameter(f"{spec.repo} is gated: accept its terms on the Hub, then set HF_TOKEN.",
                               param="repo") from None
    except RepositoryNotFoundError:
        raise InvalidParameter(f"{spec.repo} is not on the Hub (a private repo needs HF_TOKEN).",
                               param="repo") from None
    except RevisionNotFoundError:
        raise InvalidParameter(f"{spec.repo} has no revision '{revision}'.", param="revision") from None
    except (HfHubHTTPError, httpx.HTTPStatusError) as exc:
        raise MillmError(f"The Hub refused the pull: {str(exc).splitlines()[0]}") from None
    except _transport_errors() as exc:
        raise MillmError(f"Could not reach the Hub at {endpoint} ({type(exc).__name__}: {exc}); "
                         "run the same pull again to continue.") from None
    except OSError as exc:
        raise MillmError(f"Pulling {spec.repo} failed: {exc}") from None


def _part_path(local: Path, etag: str) -> Path:
    """The partial file for ``local`` at this ETag: hidden, and never listed as a model."""
    return local.with_name(f".{local.name}.{hashlib.sha256(etag.encode()).hexdigest()[:16]}.part")


def _part_bytes(part: Path, size: int | None) -> int:
    """How many bytes ``part`` holds toward a file of ``size``: 0 when there is no part, or when it holds more
    than the file has (a part from another version: removed)."""
    have = part.stat().st_size if part.exists() else 0
    if size is not None and have > size:
        part.unlink()
        return 0
    return have


def _show(progress: Progress | None, task: TaskID | None, label: str, size: int | None, have: int) -> TaskID | None:
    """The file's progress bar at ``have`` bytes: added on the first attempt, moved on the next ones."""
    if progress is None:
        return task
    if task is None:
        return progress.add_task(label, total=size, completed=have)
    progress.update(task, completed=have)
    return task


def _fetch(url: str, headers: dict[str, str], size: int | None, part: Path, label: str,
           progress: Progress | None) -> None:
    """Bring ``part`` up to ``size`` bytes from ``url``, resuming from what it holds; retried on dropped connections."""
    task: TaskID | None = None
    for attempt in range(RETRIES + 1):
        have = _part_bytes(part, size)
        task = _show(progress, task, label, size, have)
        if size is not None and have == size:
            return
        try:
            _get(url, {**headers, **({"Range": f"bytes={have}-"} if have else {})}, part, have, progress, task)
            return
        except httpx.TransportError:
            if attempt == RETRIES:
                raise
            time.sleep(RETRY_WAIT)


def _get(url: str, headers: dict[str, str], part: Path, have: int, progress: Progress | None,
         task: TaskID | None) -> None:
    with httpx.stream("GET", url, headers=headers, follow_redirects=True,
                      timeout=httpx.Timeout(30.0, read=120.0)) as response:
        response.raise_for_status()
        resumed = have > 0 and response.status_code == 206
        if not resumed and progress is not None and task is not None:
            progress.update(task, completed=0)
        with part.open("ab" if resumed else "wb") as f:
            for chunk in response.iter_bytes():  # as it arrives: a dropped connection keeps every byte
                f.write(chunk)
                if progress is not None and task is not None:
                    progress.advance(task, len(chunk))


def _download(repo: str, commit: str, file: str, local: Path, endpoint: str, known: str | None,
              progress: Progress | None) -> str | None:
    """Fetch one repo file into ``local`` unless the ETag ``known`` says it is current; its ETag if fetched."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    meta = get_hf_file_metadata(hf_hub_url(repo, file, revision=commit, endpoint=endpoint))
    etag = meta.etag or ""
    if local.is_file() and known == etag:
        return None
    headers = build_hf_headers()
    if urlsplit(meta.location).netloc != urlsplit(endpoint).netloc:
        headers.pop("authorization", None)  # a signed CDN address: the token stays on the Hub
    part = _part_path(local, etag)
    local.parent.mkdir(parents=True, exist_ok=True)
    _fetch(meta.location, headers, meta.size, part, PurePosixPath(file).name, progress)
    if meta.size is not None and part.stat().st_size != meta.size:
        raise MillmError(f"{file}: the Hub sent {part.stat().st_size} bytes of {meta.size}; run the pull again.")
    os.replace(part, local)
    for stale in local.parent.glob(f".{glob.escape(local.name)}.*.part"):
        stale.unlink()
    return etag


def _targets(spec: PullSpec, files: list[str], models: Path,
             model_id: str | None) -> tuple[Path, dict[str, Path], ModelEntry]:
    """Where ``spec`` lands under ``models``: the destination (a checkpoint folder, or one GGUF file, named by
    ``model_id`` when given), each repo file's local path, and the model entry it will be."""
    if spec.quant is None:
        dest = models / _plain_name(model_id or spec.repo.split("/")[-1])
        targets = {f: dest / f for f in checkpoint_files(spec.repo, files)}
        return dest, targets, ModelEntry(id=dest.name, engine="transformers", source="path", path=dest.resolve())
    file, quant = pick_gguf(spec.repo, spec.quant, files)
    dest = models / (f"{_plain_name(model_id)}.{quant}.gguf" if model_id else PurePosixPath(file).name)
    entry = gguf_entry(dest, "path")
    if entry is None:
        raise InvalidParameter(f"'{dest.name}' does not read as <name>.<QUANT>.gguf; pass --id to name it.",
                               param="id")
    return dest, {file: dest}, entry


def pull(spec: PullSpec, settings: Settings, *, model_id: str | None = None, revision: str | None = None,
         progress: Progress | None = None) -> PullResult:
    """Pull ``spec`` into ``settings.models_dir``: resumable, a no-op when nothing changed on the Hub."""
    from huggingface_hub import HfApi, constants

    endpoint = constants.ENDPOINT
    with _hub_errors(spec, revision, endpoint):
        info = HfApi(endpoint=endpoint).model_info(spec.repo, revision=revision)
    commit = info.sha or ""
    models = settings.models_dir
    dest, targets, entry = _targets(spec, [s.rfilename for s in info.siblings or []], models, model_id)
    _check_free(entry, settings)
    ledger = _read_ledger(settings)
    claim = ledger.get(dest.name, {})
    if dest.exists() and claim.get("repo") != spec.repo:
        raise InvalidParameter(f"{dest} exists and was not pulled from {spec.repo}; pass --id to pull under "
                               "another id.", param="id")
    models.mkdir(parents=True, exist_ok=True)
    claim = {"repo": spec.repo, "revision": commit, "files": claim.get("files", {})}
    ledger[dest.name] = claim
    _write_ledger(settings, ledger)  # claimed before the first byte, so a re-run may continue here
    downloaded, unchanged = [], []
    for file, local in targets.items():
        with _hub_errors(spec, revision, endpoint):
            etag = _download(spec.repo, commit, file, local, endpoint, claim["files"].get(file), progress)
        if etag is None:
            unchanged.append(file)
            continue
        claim["files"][file] = etag
        _write_ledger(settings, ledger)
        downloaded.append(file)
    return PullResult(entry_for_path(dest), commit, downloaded, unchanged)
