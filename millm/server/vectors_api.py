"""The steering-vector part of the management API (/api/vectors): vector sets (``millm.vectors``) listed,
shown, attached, removed, imported and exported, and learned from examples as background jobs.

A vector set registers in the SAE registry under its name, so attaching, steering (``PUT /api/steering``
with ``{"sae": NAME, "values": {"0": 8}}``), profiles and read-outs take it as they take an SAE; the attach
and detach routes here are the SAE routes' own, for names that are vector sets.

Learning runs off the event loop on the engine thread (``EngineWorker.call``: model access stays serial with
every request): ``POST /api/vectors/learn`` checks the whole body and the loaded model first (400 before any
model work), then answers 202 with a job that ``GET /api/vectors/jobs/{id}`` follows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from quart import Blueprint, Response

from millm.errors import InvalidParameter, SAENotFound
from millm.paths import user_path
from millm.sae import vector_sets
from millm.sae.vector_sets import VectorSet
from millm.server import api
from millm.server.api import body, command, steerable, use_names
from millm.server.state import services
from millm.server.vector_jobs import jobs, plan_of, start, view
from millm.steering.target import SteeringTarget
from millm.vectors import catalog, gguf

bp = Blueprint("vectors_api", __name__, url_prefix="/api/vectors")
use_names(bp)


def _no_set(name: str) -> SAENotFound:
    return SAENotFound(f"No vector set is named '{name}'; see GET /api/vectors.", param="name")


def set_record(name: str) -> dict[str, Any]:
    """The registry record of the vector set ``name`` (404 when it is not one, an SAE included)."""
    record = services().steering.store.sae(name)
    if record is None or record["format"] != "vectors":
        raise _no_set(name)
    return record


def describe(record: dict[str, Any], vs: VectorSet) -> dict[str, Any]:
    """A set as the API shows it: its registry record (``attached_layer`` included) and its file's meta."""
    meta = {k: v for k, v in vs.meta().items() if k not in ("format", "version")}
    return {**services().steering.view(record, steerable()), **meta}


# vector sets
@bp.get("")
async def list_vectors() -> Any:
    """Stored vector sets: name, vector names, layer, model, method, examples, and where each is attached; listed
    from the registry, so a set whose files are damaged or gone is listed too, ``readable`` false and its
    ``problem`` said (it can still be deleted)."""
    svc = services().steering
    sets = await asyncio.to_thread(catalog.vector_sets, svc)  # each record with its vectors.json's meta
    target = steerable()
    return {"data": [svc.view(s, target) for s in sets]}


@bp.get("/<name:name>")
async def get_vectors(name: str) -> Any:
    """One set's card: how it was made, where it is attached, and each vector's norm."""
    record = set_record(name)
    vs = await asyncio.to_thread(vector_sets.load, Path(record["path"]))
    norms = vs.vectors.float().norm(dim=-1).tolist()
    return {**describe(record, vs), "vectors": [{"index": i, "name": n, "norm": round(float(norm), 6)}
                                                for i, (n, norm) in enumerate(zip(vs.names, norms, strict=True))]}


@bp.post("/<name:name>/attach")
async def attach_vectors(name: str) -> Any:
    """Attach a vector set to a layer of the loaded model: {"layer"?} (default: the layer it was learned at).
    The SAE route's semantics and answer (POST /api/saes/{id}/attach)."""
    await body()  # a stray field is refused before the name is looked up
    set_record(name)
    return await api.attach_sae(name)


@bp.post("/<name:name>/detach")
async def detach_vectors(name: str) -> Any:
    """Detach a vector set from the loaded model (as POST /api/saes/{id}/detach)."""
    set_record(name)
    return await api.detach_sae(name)


@bp.delete("/<name:name>")
async def delete_vectors(name: str) -> Any:
    """Unregister a vector set and delete its stored folder; an attached set is detached first, as DELETE
    /api/saes/{id} does (no 409). Profiles naming it keep their entries, as they keep a deleted SAE's."""
    svc = services()
    set_record(name)
    target = steerable()
    if target is not None and name in target.steering.attachments:
        await command(svc.steering.detach, target, name)
    await asyncio.to_thread(catalog.remove, svc.steering, svc.settings.home, name)
    return {"deleted": name}


# learning
@bp.post("/learn")
async def learn_vectors() -> Any:
    """Learn vector sets in the background: {"name", "layer"?, "method"?, "position"?, "negatives"?,
    "concepts"? | "positive"? + "negative"?, "examples"?, "tokens"?, "seed"?}.

    ``concepts``: the model writes ``examples`` answers (``tokens`` each, seeded ``seed``) about them and as
    many negatives (``negatives``: about other topics, or to neutral prompts); ``positive``/``negative``: the
    texts themselves. ``layer`` (a layer, a range "8-12" or a list; one set per layer) defaults to
    ``default_layer`` (14 of SmolLM2-135M's 30). The whole body, the name (free), the method, position
    and layer are checked first (400, nothing stored); then 202 with the job, followed at GET
    /api/vectors/jobs/{id} and cancelled with DELETE /api/vectors/jobs/{id}. The model work runs in slices
    that requests share the engine with; an unload waits for the job up to its graceful timeout, then cancels
    it. One job learns at a time: another is refused with 409 ``learn_job_running`` while one is queued or
    running (never queued behind it). A model that cannot read its residual stream (llama.cpp) is refused
    with 400 field_not_honoured; no model with 503 model_not_loaded."""
    data = await body()
    job = await start(*await plan_of(data))
    return view(job), 202, {"Location": f"/api/vectors/jobs/{job.id}"}


@bp.get("/jobs")
async def list_jobs() -> Any:
    """The learning jobs kept (the newest 64, across restarts), newest first."""
    return {"data": [view(j) for j in jobs().newest()]}


@bp.get("/jobs/<job_id>")
async def get_job(job_id: str) -> Any:
    """A learning job: status queued|running|succeeded|failed|cancelled, progress, the sets' names once it
    succeeded (``vector_sets``), the error body once it failed or was cancelled (a job running when its server
    stopped reads failed, error code ``interrupted``)."""
    return view(jobs().get(job_id))


@bp.delete("/jobs/<job_id>")
async def cancel_job(job_id: str) -> Any:
    """Cancel a queued or running learning job: 200 the job, status ``cancelled``, nothing stored (its slice
    running ends at its next decode step). Cancelling a cancelled job again answers the same; a job that
    succeeded or failed is a 409 ``job_finished`` (its record stays; remove the sets it stored with DELETE
    /api/vectors/{name}); an unknown id a 404 ``job_not_found``."""
    return view(await jobs().cancel(job_id))


# import and export
UNREADABLE = "'path' is not a readable vector-set folder or llama.cpp control-vector GGUF on this server"


def locate(path: Path) -> tuple[Path, str]:
    """What ``path`` is: a vector-set ``folder`` or a ``gguf`` file. A missing path and an unreadable one answer
    alike (a symlink loop too), so the route tells nothing about the server's files."""
    try:
        resolved = user_path(path).resolve()
        if resolved.is_dir() and vector_sets.is_vector_set(resolved):
            return resolved, "folder"
        if resolved.is_file() and resolved.suffix.lower() == ".gguf":
            return resolved, "gguf"
    except (OSError, RuntimeError, ValueError):  # Python 3.11's resolve() raises RuntimeError on a symlink loop
        pass
    raise InvalidParameter(UNREADABLE + ".", param="path")


def read_folder(folder: Path, given: str, name: str, layer: int | None,
                target: SteeringTarget | None) -> list[VectorSet]:
    """The set in a vector-set folder, under ``name``, held to the rules every set passes (``vector_sets.load``; a
    refusal names the file under ``given``, the path as the client gave it, and the key); ``layer``, if given,
    must be the one it records. With a model loaded, a set of that model (or of none named) must fit it: a
    layer it has and its width."""
    model = target.model_id if target is not None else None
    vs = vector_sets.load(folder, given, "path")
    if target is not None and vs.model in ("", model):
        where = vector_sets.shown_file(given, vector_sets.META_FILE)
        vector_sets.check_layer(vs.layer, f"{where}: key 'layer'", "path", target.steering.n_layers)
        if vs.d_model != target.steering.d_model:
            raise InvalidParameter(f"{vector_sets.shown_file(given, vector_sets.WEIGHTS_FILE)}: tensor 'vectors' is "
                                   f"{vs.d_model} wide; the loaded model '{model}' is {target.steering.d_model}.",
                                   param="path")
    if layer is not None and layer != vs.layer:
        raise InvalidParameter(f"The vector set at 'path' was learned at layer {vs.layer}; 'layer' picks a layer of "
                               "a GGUF control vector (attach the set elsewhere with POST "
                               "/api/vectors/{name}/attach).", param="layer")
    return [renamed(vs, name)]


def read_gguf(file: Path, given: str, name: str, layer: int | None, target: SteeringTarget) -> list[VectorSet]:
    """A control-vector file's directions, checked against the loaded model: the set ``name`` (its one layer,
    or the one ``layer`` picks), else one set ``name-L{layer}`` per layer it holds. Refusals name the file as
    ``given`` and the tensor."""
    cv = gguf.read(file, target.steering.n_layers, target.steering.d_model, given, "path")
    return gguf.imported_sets(cv, given, name, target.model_id, layer)


@bp.post("/import")
async def import_vectors() -> Any:
    """Import vector sets: {"path", "name", "layer"?} -> 201 {"data": [the sets stored]}.

    ``path`` is a miLLM vector-set folder or a llama.cpp control-vector GGUF on the server; either is stored
    as a copy under MILLM_HOME/vectors (a taken name is a 400, as for learning; all or nothing). A GGUF is
    checked against the loaded model; one direction per layer is one set: ``name`` for a file of one layer
    or the layer ``layer`` picks, else ``name-L{layer}`` for each. Every set is held to the rules learned ones
    are (docs/vectors.md): a malformed one is a 400 naming the file, as ``path`` gave it, and the key, and
    nothing is stored."""
    data = await body()
    path, layer = data["path"], data.get("layer")
    if layer is not None:  # the schema took an integer; JSON's 1.0 is one too
        layer = vector_sets.check_layer(int(layer) if isinstance(layer, float) else layer, "'layer'", "layer")
    if not path or "\0" in path:
        raise InvalidParameter(UNREADABLE + ".", param="path")
    svc = services()
    name = await asyncio.to_thread(catalog.check_new_name, svc.steering, data["name"])
    found, kind = await asyncio.to_thread(locate, Path(path))
    if kind == "folder":
        sets = await asyncio.to_thread(read_folder, found, path, name, layer, steerable())
        records = [await asyncio.to_thread(catalog.store, svc.steering, svc.settings.home, sets[0])]
    else:
        sets = await asyncio.to_thread(read_gguf, found, path, name, layer, api.engine())
        records = await asyncio.to_thread(catalog.store_all, svc.steering, svc.settings.home, sets)
    return {"data": [describe(r, vs) for r, vs in zip(records, sets, strict=True)]}, 201


@bp.get("/<name:name>/export")
async def export_vectors(name: str) -> Any:
    """The set as a llama.cpp control-vector GGUF (application/octet-stream, ``NAME.gguf``): its unit vector at
    its layer, so ``llama-cli --control-vector-scaled NAME.gguf S`` steers at strength S. A set of several
    vectors, or one at layer 0 (which control vectors cannot steer), is a 400."""
    record = set_record(name)
    data = await asyncio.to_thread(gguf_bytes, Path(record["path"]))
    return Response(data, mimetype="application/octet-stream",
                    headers={"Content-Disposition": f'attachment; filename="{name}.gguf"'})


def gguf_bytes(folder: Path) -> bytes:
    """The GGUF of the set in ``folder``, written to a scratch folder and read back."""
    vs = vector_sets.load(folder)
    directions = gguf.set_directions(vs)
    with tempfile.TemporaryDirectory(prefix="millm-export-") as scratch:
        out = Path(scratch) / "vectors.gguf"
        gguf.write(out, directions, vs.model)
        return out.read_bytes()


def renamed(vs: VectorSet, name: str) -> VectorSet:
    """The set stored under ``name`` (its first vector's name, which is the set's)."""
    return dataclasses.replace(vs, names=(name, *vs.names[1:]))
