"""The scheduler: the one decode loop of the transformers engine, batched or serial.

One thread (the engine worker's, or the caller's for ``TransformersEngine.run``) calls ``step``. Each
step runs the operator's queued commands, retires rows whose consumer left or whose steering an
operator change made invalid, drops waiting requests whose consumer left, admits waiting requests into
free KV slots (each one's steering checked first), prefills admitted prompts' chunks of several rows
together in one forward (``millm.engine.decode.prefill``), then decodes one token for every decoding row in one
forward, streams each row's text and retires finished rows, freeing their slot at once. Nothing is ever
re-prefilled: a row's keys and values stay in its slot (``millm.engine.decode.kv``) until it leaves.

Requests run in lanes (``millm.engine.decode.lanes``): the shared lane batches (continuous batching, when
``BatchSettings`` are given), and one request at a time is served alone in a lane of its own (the
serial path: every request when batching is off; a seeded one, or one the batch cannot hold, when on).

Everything that differs between requests is per row: sampling parameters, penalties, the constraint's
matcher (response_format), the random generator (a seed), the steering delta (a row of the steering
controller's row buffer), and the readers after or before steering (monitoring, return_sae_activations).
So requests with different parameters and profiles share a batch, each decoded as it would be alone (up
to floating-point summation order, which greedy text does not notice; the tests compare it).

A failure in one request's own work (binding its steering, its logits, its text) ends that request
alone, with the spec's in-stream error; only a failure of a shared forward (a merged prefill, the
decode) ends every row in it.

A decode step's shapes are (slots ``[0, highest busy slot]``, a span in ``SPAN_STEP`` buckets) and its
tensors live at fixed addresses (the slot cache, the steering row buffers), so a CUDA-graph decode can
later round the rows up to fixed buckets and replay one graph per (rows, span) without changing the
KV layout.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

from millm.engine.decode.admission import BatchSettings, rows_of
from millm.engine.decode.draw import draw
from millm.engine.decode.jobs import BatchRow, Job
from millm.engine.decode.kv import SPAN_STEP, KVShape, SlotCache, span_for
from millm.engine.decode.lanes import Lane
from millm.engine.decode.output import ChoiceOutput
from millm.engine.decode.prefill import Merged, choose, inputs
from millm.engine.decode.reacting import react
from millm.engine.decode.readers import monitored, observe, readers, unobserve
from millm.engine.decode.rows import Row, emit
from millm.engine.events import Activations, Sensed, Steered, Usage, Verdicts
from millm.engine.shared_prefix import hand_on, share_starts
from millm.steering.target import (
    GENERATED_PHASE,
    PROMPT_PHASE,
    Monitor,
    RowView,
    Steering,
)
from millm.structured.constraint import RowGuides, stop_scope, validate
from millm.structured.endings import endings

if TYPE_CHECKING:
    from millm.structured.constraint import ConstraintCompiler

__all__ = ["BatchEngine", "Job", "Scheduler"]  # Job: millm.engine.decode.jobs, where the records live

RATE_WINDOW = 5.0  # seconds of decoded tokens the batch's tokens/s is measured over
KEEP_ALONE_BYTES = 256 * 2**20  # an alone lane's KV cache at most this big is kept for the next request


class BatchEngine(Protocol):
    """What the scheduler needs of an engine: its model, tokenizer, steering, monitor and constraints."""

    model: Any
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    stop_ids: frozenset[int]
    pad_id: int
    steering: Steering
    monitor: Monitor
    constraints: ConstraintCompiler

    @property
    def model_id(self) -> str: ...

    def token_texts(self, ids: list[int]) -> list[str]: ...


class Scheduler:
    """An engine's lanes, the waiting requests, and the step that drives them."""

    def __init__(self, engine: BatchEngine, settings: BatchSettings | None) -> None:
        self.engine = engine
        self.settings = settings
        self.shape = KVShape.of(engine.model.config)
        self.vocab = int(engine.model.config.vocab_size)
        self.shared: Lane | None = None
        if settings is not None:
            cache = SlotCache(self.shape, settings.max_rows, settings.slot_len, engine.dtype, engine.device)
            self.shared = Lane(cache, 0, settings.prefill_chunk, self.vocab)
            engine.steering.reserve_rows(settings.max_rows)
        self.alone: Lane | None = None  # the serial lane (kept between requests while small)
        self.alone_job: Job | None = None
        self.waiting: deque[Job] = deque()
        self._lock = threading.Lock()
        self._decoded: deque[tuple[float, int]] = deque()  # (time, tokens) of recent shared decode steps
        self.run_commands: Callable[[], None] = lambda: None

    # any thread
    def submit(self, job: Job) -> None:
        with self._lock:
            self.waiting.append(job)

    @property
    def lanes(self) -> list[Lane]:
        return [lane for lane in (self.shared, self.alone) if lane is not None]

    @property
    def busy(self) -> bool:
        return bool(self.waiting or any(lane.rows for lane in self.lanes))

    @property
    def active_rows(self) -> int:
        return sum(len(lane.rows) for lane in self.lanes)

    @property
    def free(self) -> list[int]:
        """The shared lane's free slots."""
        return list(self.shared.free) if self.shared is not None else []

    @property
    def queued(self) -> int:
        return len(self.waiting)

    def tokens_per_second(self) -> float:
        """Tokens the batch decoded per second over the last RATE_WINDOW seconds."""
        now = time.monotonic()
        recent = [(t, n) for t, n in list(self._decoded) if now - t <= RATE_WINDOW]
        if not recent:
            return 0.0
        span = max(now - recent[0][0], 1e-3)
        return sum(n for _, n in recent) / span

    # the engine thread
    def step(self) -> None:
        """One scheduling step: commands, retirements, admissions, prefill chunks, one decode per lane."""
        self.run_commands()
        with torch.inference_mode():
            self._check_jobs()
            self._admit()
            for lane in self.lanes:
                self._prefill(lane)
            for lane in self.lanes:
                self._decode(lane)

    def abandon(self, job: Job) -> None:
        """End ``job`` now (its consumer left): out of the queue, or its rows freed."""
        with self._lock:
            waited = job in self.waiting
            if waited:
                self.waiting.remove(job)
        if waited:
            job.end(None)
        else:
            self._finish(job, None)

    def _jobs(self) -> list[Job]:
        return list(dict.fromkeys(r.job for lane in self.lanes for r in lane.rows.values()))

    def _check_jobs(self) -> None:
        """End the admitted requests whose consumer left, or whose steering an operator change made invalid."""
        for job in self._jobs():
            if job.control.cancel.is_set():
                self._finish(job, job.control.reason)
                continue
            try:
                self._check(job)
            except Exception as exc:  # this request's steering is invalid now: it ends, the others go on
                self._finish(job, exc)

    def _check(self, job: Job) -> None:
        if job.check is not None:
            job.check()
        errors = self.engine.steering.row_errors
        lane = self._lane_of(job)
        for r in job.rows:
            if lane is not None and lane.first + r.slot in errors:
                raise errors[lane.first + r.slot]

    def _admit(self) -> None:
        """Drop the waiting requests whose consumer left; then start the waiting requests their lanes have room
        for: each is checked first, so a request whose steering became invalid while it waited sends no text."""
        gone, starts = self._take_waiting()
        for job in gone:
            job.end(job.control.reason)
        for job in starts:
            try:
                self._check(job)
                lane = self._lane_for(job)
            except Exception as exc:  # invalid (or its cache cannot be had) before its first token: it ends
                job.end(exc)
                continue
            self._start(job, lane)

    def _take_waiting(self) -> tuple[list[Job], list[Job]]:
        """Out of the queue: the requests whose consumer left, and those that start now (``_starts``)."""
        with self._lock:
            gone = [job for job in self.waiting if job.control.cancel.is_set()]
            starts = self._starts([job for job in self.waiting if job not in gone])
            self.waiting = deque(job for job in self.waiting if job not in gone and job not in starts)
        return gone, starts

    def _starts(self, waiting: list[Job]) -> list[Job]:
        """The waiting requests that start now, in order per lane: the shared lane while its free slots hold them,
        first come first served; the alone lane one at a time."""
        starts: list[Job] = []
        alone_taken = self.alone_job is not None
        free: int | None = len(self.shared.free) if self.shared is not None else 0
        for job in waiting:
            if job.alone or self.shared is None:
                if not alone_taken:
                    alone_taken = True
                    starts.append(job)
            elif free is not None and rows_of(job.plans) <= free:
                free -= rows_of(job.plans)
                starts.append(job)
            else:
                free = None  # later shared requests wait behind this one
        return starts

    def _lane_of(self, job: Job) -> Lane | None:
        """The lane a started request's rows are in: the alone lane for the request served alone, else the shared
        one (a request that has ended holds no row in either)."""
        return self.alone if job is self.alone_job else self.shared

    def _lane_for(self, job: Job) -> Lane:
        """The shared lane, or for a request served alone a lane sized to it (the last one when it fits)."""
        if not (job.alone or self.shared is None):
            assert self.shared is not None
            return self.shared
        rows, length = rows_of(job.plans), job.length
        budget = rows * max(len(ids) for p in job.plans for ids in p.prompt_ids)  # every prompt in one forward
        if self.alone is None or not self.alone.fits(rows, length):
            self.alone = None  # the old cache goes before the new one is allocated
            first = self.shared.cache.slots if self.shared is not None else 0
            # whole SPAN_STEP buckets: a forward's span depends only on its rows, never on the lane's size,
            # so a seeded request's arithmetic is the same in a new lane and in a reused, larger one
            cache = SlotCache(self.shape, rows, span_for(length, length + SPAN_STEP), self.engine.dtype,
                              self.engine.device)
            self.alone = Lane(cache, first, budget, self.vocab)
            self.engine.steering.reserve_rows(first + rows)
        self.alone.prefill_budget = budget
        self.alone_job = job
        return self.alone

    def _start(self, job: Job, lane: Lane) -> None:
        """Bind each of the job's rows to a slot, with its own generator and matcher; rows that start alike share
        their start's KV (``millm.engine.shared_prefix``: not while a reader reads each row's prompt). A failure
        here (its steering cannot be bound) ends this request alone, with every slot it took freed."""
        engine = self.engine
        job.rows_left = rows_of(job.plans)
        try:
            sae = monitored(engine)
            starts = sae is None and all(p.readout is None and not p.probes for p in job.plans)
            for r in share_starts(self._rows(job), starts):
                lane.take(r)
                job.rows.append(r)
                engine.steering.bind_row(lane.first + r.slot, r.plan.steering, r.plan.scope)  # each plan its own
            job.send(Steered(engine.steering.label(job.plans[0].steering)))
            observe(engine, job, sae)
        except Exception as exc:  # this request's own setup failed: it ends, the others go on
            self._finish(job, exc)

    def _rows(self, job: Job) -> list[BatchRow]:
        """The job's rows, choice by choice (a prompt's n choices one after another, plan by plan), each with its
        own text and matcher, and its plan's random generator."""
        engine = self.engine
        rows: list[BatchRow] = []
        for plan in job.plans:
            generator = None
            if plan.params.seed is not None:
                generator = torch.Generator(device=engine.device).manual_seed(plan.params.seed)
            stops, until = stop_scope(plan.constraint, plan.params.stop)
            for prompt in plan.prompt_ids:
                for _ in range(plan.params.n):
                    row = Row(len(rows), ChoiceOutput(engine.tokenizer, stops, engine.stop_ids, until), plan.params,
                              plan.max_tokens)
                    guide = None
                    if plan.constraint is not None:
                        guide = RowGuides([engine.constraints.matcher(plan.constraint)], self.vocab)
                    rows.append(BatchRow(job, row, plan, prompt, generator=generator, guide=guide))
        return rows

    def _forward(self, lane: Lane, ids: torch.Tensor, first: int, positions: torch.Tensor, rows: list[BatchRow],
                 mask_positions: torch.Tensor, phase: int) -> torch.Tensor:
        """Last-position logits (fp32) of one forward over the lane's slots ``[first, first + len(ids))``, feeding
        prompt or generated positions (``phase``: each row's steering scope gates its delta)."""
        device = self.engine.device
        ids, positions, mask_positions = ids.to(device), positions.to(device), mask_positions.to(device)
        mask = lane.cache.bind(first, positions, mask_positions)
        pre, post = readers(rows, first, positions, lane.cache.aside)
        view = RowView(lane.first + first, ids.shape[0], pre, post, phase)
        with self.engine.steering.rows(view):
            out = self.engine.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=lane.cache,
                                    use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :].float()

    def _shared_forward(self, lane: Lane, ids: torch.Tensor, first: int, positions: torch.Tensor,
                        rows: list[BatchRow], mask_positions: torch.Tensor, phase: int) -> torch.Tensor | None:
        """``_forward``, or None when it failed: a shared forward's failure ends every row in it."""
        try:
            return self._forward(lane, ids, first, positions, rows, mask_positions, phase)
        except Exception as exc:
            for job in dict.fromkeys(r.job for r in rows):
                self._finish(job, exc)
            return None

    def _prefill(self, lane: Lane) -> None:
        """Feed waiting prompt chunks of several rows in one forward, within the lane's prefill budget
        (padding included, ``millm.engine.decode.prefill``); a finished prompt samples its first token (and the
        rows that took its whole prompt, its other choices, sample from the same logits), a prompt that did not
        fit continues next step. If the forward fails, every row in it ends with the error."""
        merged = choose([(r.slot, len(r.prompt) - r.filled) for r in lane.prefilling()], lane.prefill_budget)
        fed = self._feed(lane, merged) if merged is not None else None
        if merged is None or fed is None:
            return
        rows, logits = fed
        sampled = self._prompted(rows, hand_on(list(lane.rows.values()), lane.cache.copy_prefix), merged.first)
        if sampled:
            self._sample(lane, [row for row, _ in sampled], logits[[at for _, at in sampled]])

    @staticmethod
    def _prompted(rows: list[BatchRow], whole: list[tuple[BatchRow, BatchRow]],
                  first: int) -> list[tuple[BatchRow, int]]:
        """The rows whose prompt is in now, each with its logits' row in the forward from slot ``first``: each fed
        row that finished its prompt, followed by the rows that took that whole prompt (``whole``: row, donor)."""
        return [(row, r.slot - first) for r in rows if r.filled == len(r.prompt)
                for row in [r, *(other for other, donor in whole if donor is r)]]

    def _feed(self, lane: Lane, merged: Merged) -> tuple[list[BatchRow], torch.Tensor] | None:
        """One merged prefill forward: the rows it fed (each one's ``filled`` moved on) and its logits; None when
        it failed (its rows have ended)."""
        rows = [lane.rows[slot] for slot in merged.takes]
        feeds = {r.slot: (r.filled, r.prompt[r.filled:r.filled + merged.takes[r.slot]]) for r in rows}
        ids, writes, reads = inputs(merged, feeds, self.engine.pad_id, lane.cache.aside)
        logits = self._shared_forward(lane, ids, merged.first, writes, rows, reads, PROMPT_PHASE)
        if logits is None:
            return None
        for r in rows:
            r.filled += merged.takes[r.slot]
        return rows, logits

    def _decode(self, lane: Lane) -> None:
        """One token for every decoding row of the lane, in one forward over its slots ``[0, highest busy]``."""
        rows = [r for r in lane.rows.values() if r.next_token is not None]
        if not rows:
            return
        ids, writes, reads = self._decode_inputs(lane, rows)
        logits = self._shared_forward(lane, ids, 0, writes, rows, reads, GENERATED_PHASE)
        if logits is None:
            return
        for r in rows:
            r.next_token = None
        self._sample(lane, rows, logits[[r.slot for r in rows]])  # each row's failure is its own
        if lane is self.shared:
            self._count_decoded(len(rows))

    def _decode_inputs(self, lane: Lane, rows: list[BatchRow]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A decode forward's ``(ids, writes, reads)``, ``[slots, 1]``: each row's sampled token at its length; a
        slot not decoding now writes at its last position (never a fed token's) and reads key 0."""
        high = max(r.slot for r in rows) + 1
        ids = torch.full((high, 1), self.engine.pad_id, dtype=torch.long)
        writes = torch.full((high, 1), lane.cache.aside, dtype=torch.long)
        reads = torch.zeros((high, 1), dtype=torch.long)
        for r in rows:
            assert r.next_token is not None
            ids[r.slot, 0] = r.next_token
            writes[r.slot, 0] = reads[r.slot, 0] = r.length
        return ids, writes, reads

    def _count_decoded(self, tokens: int) -> None:
        """Count a shared decode step's tokens for ``tokens_per_second``."""
        self._decoded.append((time.monotonic(), tokens))
        while self._decoded and time.monotonic() - self._decoded[0][0] > RATE_WINDOW:
            self._decoded.popleft()

    def _sample(self, lane: Lane, rows: list[BatchRow], logits: torch.Tensor) -> None:
        """Each row's next token (``millm.engine.decode.draw``); then its text, and its end when it ends.

        Every failure is one row's: a row whose logits no token can be drawn from ends alone, and when the
        shared draw fails anyway each row is drawn again on its own, so only the row that breaks it ends.
        """
        try:
            drawn, failed = draw(rows, logits, lane.counts, lane.prompted)
        except Exception as exc:
            if len(rows) == 1:
                self._finish(rows[0].job, exc)
                return
            for i, r in enumerate(rows):
                if lane.holds(r):
                    self._sample(lane, [r], logits[i:i + 1])
            return
        for r, error in failed:
            if lane.holds(r):
                self._finish(r.job, error)
        for r, token in drawn:
            if not lane.holds(r):  # its request already ended in this step
                continue
            try:
                self._emit(lane, r, token)
            except Exception as exc:  # this row's own work failed: its request ends, the others go on
                self._finish(r.job, exc)

    def _emit(self, lane: Lane, r: BatchRow, token: int) -> None:
        """Feed ``token`` to the row; a constrained row that closed its document is validated before any of
        its events go out (a document that does not validate is never reported complete). A tool-call row ends
        once nothing but blanks can follow its calls, and whole calls the budget cut end it "stop", not
        "length" (``millm.structured.endings``)."""
        if r.job.watching is not None and self._reacts(lane, r):
            return
        r.next_token = token
        guide = r.guide
        constraint = r.plan.constraint
        rules = endings(constraint) if guide is not None else None
        output = r.row.output

        def closes(t: int) -> bool:  # the matcher stopped, or tool calls that nothing but blanks can follow
            assert guide is not None
            return bool(guide.advance(0, t)) or (rules is not None and rules.ended(output.text))

        events = emit(r.row, token, None if guide is None else closes, None if rules is None else rules.complete)
        if guide is not None and constraint is not None and r.row.output.finish_reason == "stop":
            validate(constraint, r.row.output.text)
        for event in events:
            r.job.send(event)
        if r.row.done:
            self._retire(lane, r)

    def _retire(self, lane: Lane, r: BatchRow) -> None:
        """A row finished: free its slot; the request ends (with its read-out and Usage) when its last row does."""
        job = r.job
        self._free(lane, r)
        job.completion_tokens += r.row.output.tokens
        job.rows_left -= 1
        if job.rows_left == 0:
            if job.watching is not None:
                job.send(Verdicts(job.watching.verdicts()))
            if job.sensing is not None and (sensed := job.sensing.events()):
                job.send(Sensed(sensed))
            if job.recorder is not None:
                first = job.rows[0]
                job.send(Activations(job.recorder.result(first.prompt + first.row.output.detok.ids, len(first.prompt))))
            job.send(Usage(job.prompt_tokens, job.completion_tokens))
            self._close(job, None)

    def _reacts(self, lane: Lane, r: BatchRow) -> bool:
        """Act on the row's armed probes that fired in the forward just run (``millm.engine.decode.reacting``);
        True when one ended the row (the token sampled from that forward is dropped)."""
        assert r.job.watching is not None
        events, rebind = react(r.job.watching, r.row)
        if rebind is not None:  # steered from the next forward on, this row alone
            self.engine.steering.bind_row(lane.first + r.slot, rebind, r.plan.scope)
        for event in events:
            r.job.send(event)
        if r.row.done:
            self._retire(lane, r)
        return r.row.done

    def _free(self, lane: Lane, r: BatchRow) -> None:
        lane.release(r)
        self.engine.steering.release_row(lane.first + r.slot)

    def _close(self, job: Job, error: BaseException | None) -> None:
        """The request's end: the alone lane handed on, its monitoring committed, its consumer told (told even
        when the commit fails, so no consumer waits on a request that has ended)."""
        session, job.session = job.session, None
        unobserve(self.engine, job)
        if job is self.alone_job:
            self.alone_job = None
            if self.alone is not None and self.alone.cache.nbytes > KEEP_ALONE_BYTES:
                self.alone = None
        try:
            if session is not None:
                self.engine.monitor.commit(session, self.engine.model_id)
        finally:
            job.end(error)

    def _finish(self, job: Job, error: BaseException | None) -> None:
        """End a request early (cancelled, or failed): free every row it still holds."""
        lane = self._lane_of(job)
        if lane is not None:
            for r in job.rows:
                if lane.holds(r):
                    self._free(lane, r)
        if job.rows_left > 0:
            job.rows_left = 0
            self._close(job, error)
        elif job is self.alone_job:
            self._close(job, error)

    def fail_all(self, error: BaseException) -> None:
        """Something outside any one row broke the step: every admitted and waiting request ends with it."""
        for job in self._jobs():
            self._finish(job, error)
        with self._lock:
            waiting, self.waiting = list(self.waiting), deque()
        for job in waiting:
            job.end(error)
