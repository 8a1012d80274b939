"""The SAE readers of a forward's rows: monitoring and a request's read-out, per SAE, before and after each row's
steering delta, reading only the row's real positions."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from millm.engine.decode.jobs import BatchRow
    from millm.steering.target import Reader

Readers = dict[str, list[tuple[int, "Reader"]]]  # per SAE: (row offset in the forward, reader)


def readers(rows: list[BatchRow], first: int, writes: torch.Tensor, aside: int) -> tuple[Readers, Readers]:
    """Each fed row's readers, per SAE, before and after its steering delta (monitoring; a read-out at its
    read point), reading only the row's real positions: a merged prefill's padding (queries writing at
    the cache's ``aside``) is left out. ``first`` is the forward's first slot."""
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
        if not wanted:
            continue
        offset = r.slot - first
        pad = int((writes[offset] == aside).sum())
        for found, sae_id, read in wanted:
            found.setdefault(sae_id, []).append((offset, read if pad == 0 else _trimmed(read, pad)))
    return pre, post


def _trimmed(read: Reader, pad: int) -> Reader:
    """``read`` of a row's residual without its ``pad`` leading padding positions."""
    return lambda hidden: read(hidden[:, pad:])
