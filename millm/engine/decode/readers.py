"""The readers of a forward's rows: monitoring and a request's read-out, per SAE, before and after each row's
steering delta, and its probes, per layer; each reading only the row's real positions. ``observe`` gives a
request its readers when it starts, ``unobserve`` takes its probes' hooks off when it ends."""

from __future__ import annotations

from typing import TYPE_CHECKING

from millm.steering.target import PROBE_PROMPT, PROBE_RESPONSE, ReadoutRecorder, Watching, reader_key, sensing_for

if TYPE_CHECKING:
    import torch

    from millm.engine.decode.jobs import BatchRow, Job
    from millm.engine.decode.scheduler import BatchEngine
    from millm.steering.target import Reader

Readers = dict[str, list[tuple[int, "Reader"]]]  # per SAE (or probe layer): (row offset in the forward, reader)


def readers(rows: list[BatchRow], first: int, writes: torch.Tensor, aside: int) -> tuple[Readers, Readers]:
    """Each fed row's readers, per SAE, before and after its steering delta (monitoring; a read-out at its
    read point), and its probes' per layer (``reader_key``), reading only the row's real positions: a merged
    prefill's padding (queries writing at the cache's ``aside``) is left out. ``first`` is the forward's first
    slot."""
    pre: Readers = {}
    post: Readers = {}
    for r in rows:
        job = r.job
        wanted: list[tuple[Readers, str, Reader]] = []
        if job.session is not None and job.monitored_sae is not None:
            wanted.append((pre, job.monitored_sae, job.session))
        if job.recorder is not None:
            spec = job.recorder.spec
            wanted.append((pre if spec.read_point == "pre_steering" else post, spec.sae_id, job.recorder))
        if job.watching is not None:  # a decoding row has its sampled token pending: it reads the response
            span = PROBE_RESPONSE if r.next_token is not None else PROBE_PROMPT
            wanted += [(pre, reader_key(layer), job.watching.reader(layer, r.row.index, span))
                       for layer in job.watching.layers]
        if job.sensing is not None and r.next_token is not None:  # sensing reads the fed response tokens
            wanted += [(pre, sae_id, job.sensing.reader(sae_id, r.row.index)) for sae_id in job.sensing.on]
        if not wanted:
            continue
        offset = r.slot - first
        pad = int((writes[offset] == aside).sum())
        for found, key, read in wanted:
            found.setdefault(key, []).append((offset, read if pad == 0 else _trimmed(read, pad)))
    return pre, post


def _trimmed(read: Reader, pad: int) -> Reader:
    """``read`` of a row's residual without its ``pad`` leading padding positions."""
    return lambda hidden: read(hidden[:, pad:])


def monitored(engine: BatchEngine) -> str | None:
    """The SAE monitoring reads, while it is on and attached."""
    config = engine.monitor.config
    return config.sae if config.enabled and config.sae in engine.steering.attachments else None


def observe(engine: BatchEngine, job: Job, sae: str | None) -> None:
    """The job's readers: a monitoring session on ``sae`` (what ``monitored`` says), its read-out's recorder,
    its probes' state, their layers watched, and its sensing clusters' (only while an attached SAE has one)."""
    if sae is not None:
        job.session = engine.monitor.session()
        job.session.sae = engine.steering.attachments[sae].sae
        job.monitored_sae = sae
    readout = job.plans[0].readout
    if readout is not None:
        job.recorder = ReadoutRecorder(readout, engine.steering, engine.token_texts)
    watches = job.plans[0].probes
    rows = sum(len(p.prompt_ids) * p.params.n for p in job.plans)
    if watches:
        job.watching = Watching(watches, rows, job.length, engine.device, engine.dtype)
        for layer in job.watching.layers:
            engine.steering.watch_layer(layer)
        job.watched = True
    job.sensing = sensing_for([(a.sae_id, a.sae, a.sensors) for a in engine.steering.attachments.values()],
                              rows, job.length, engine.device)


def unobserve(engine: BatchEngine, job: Job) -> None:
    """Take the job's probe hooks off, once (its probes' state stays, for its verdicts)."""
    if job.watched and job.watching is not None:
        job.watched = False
        for layer in job.watching.layers:
            engine.steering.unwatch_layer(layer)
