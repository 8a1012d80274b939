"""Continuous batching: the scheduler that owns a transformers engine's batched decode loop.

One thread (the engine worker's) calls ``step``. Each step runs the operator's queued commands,
retires rows whose consumer left or whose steering an operator change made invalid, drops waiting
requests whose consumer left, admits waiting requests into free KV slots (each one's steering
checked first), prefills the admitted prompts' chunks of several rows together in one forward
(``millm.engine.prefill``; at most ``prefill_chunk`` tokens a step, so a long prompt does not stall
the streams in flight), then decodes one token for every decoding row in one forward over the slots, streams each
row's text and retires finished rows, freeing their slot at once. Nothing is ever re-prefilled: a
row's keys and values stay in its slot (``millm.engine.kv``) until it leaves.

A failure in one request's own work (binding its steering, its logits, its text) ends that request
alone, with the spec's in-stream error; only a failure of a shared forward (a merged prefill, the
decode) ends every row in it.

Each row carries its own sampling parameters and its own steering (a delta row in the steering
controller's row buffer), so requests with different temperatures, penalties, stops, budgets and
profiles share a batch and each is decoded exactly as it would be alone (up to floating-point
summation order, which greedy text does not notice; the tests compare it).

A decode step's shapes are (slots ``[0, highest busy slot]``, a span in ``SPAN_STEP`` buckets) and its
tensors live at fixed addresses (the slot cache, the steering row buffers), with filler rows already
handled, so a CUDA-graph decode can later round the rows up to fixed buckets and replay one graph
per (rows, span) without changing the KV layout.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch

from millm.engine.events import Event, Usage
from millm.engine.kv import KVShape, SlotCache
from millm.engine.output import ChoiceOutput
from millm.engine.plan import Plan
from millm.engine.prefill import choose, inputs
from millm.engine.rows import Row, emit
from millm.engine.sampling import apply_penalties, sample_rows, unsampleable, update_counts
from millm.errors import NonFiniteLogits
from millm.steering.controller import RowView, Steering
from millm.steering.monitor import Monitor, MonitorSession

if TYPE_CHECKING:
    from millm.config import Settings
    from millm.engine.base import StepControl

RATE_WINDOW = 5.0  # seconds of decoded tokens the batch's tokens/s is measured over


@dataclass(frozen=True)
class BatchSettings:
    """How big the batch may grow: rows, the KV token budget (split into equal slots), the tokens a
    step's merged prefill forward may hold (padding included), and whether monitored requests are
    batched or served serially."""

    max_rows: int = 16
    max_tokens: int = 32768
    prefill_chunk: int = 256
    monitoring: Literal["batch", "serial"] = "batch"

    @property
    def slot_len(self) -> int:
        return self.max_tokens // self.max_rows

    @classmethod
    def of(cls, settings: Settings) -> BatchSettings:
        """The configured bounds, whether or not the server batches (``millm batch`` always may)."""
        return cls(settings.batch_max_rows, settings.batch_max_tokens, settings.batch_prefill_chunk,
                   settings.batching_monitoring)

    @classmethod
    def from_settings(cls, settings: Settings) -> BatchSettings | None:
        """The batch settings when continuous batching is enabled (MILLM_BATCHING), else None."""
        return cls.of(settings) if settings.batching else None


def fallback_reason(plans: list[Plan], batch: BatchSettings, monitoring: bool) -> str | None:
    """Why a generation is served on the serial path instead of the batch (None: it is batched).

    n > 1, a seed (its own random generator, so its text never depends on batch traffic), several
    conversations (extra_messages), a read-out (return_sae_activations), a constraint, active
    monitoring when MILLM_BATCHING_MONITORING=serial, and what cannot fit the batch: a row longer than
    a KV slot, or more prompts than the batch has rows.
    """
    for plan in plans:
        if plan.params.n > 1:
            return "n"
        if plan.params.seed is not None:
            return "seed"
        if len(plan.prompt_ids) > 1:
            return "extra_messages"
        if plan.readout is not None:
            return "return_sae_activations"
        if plan.constraint is not None:
            return "response_format"
    if monitoring and batch.monitoring == "serial":
        return "monitoring"
    if len(plans) > batch.max_rows or any(len(p.prompt_ids[0]) + p.max_tokens > batch.slot_len for p in plans):
        return "too_long"
    return None


class BatchEngine(Protocol):
    """What the scheduler needs of an engine: its model, tokenizer, steering and monitor."""

    model: Any
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    stop_ids: frozenset[int]
    pad_id: int
    steering: Steering
    monitor: Monitor

    @property
    def model_id(self) -> str: ...

    @property
    def vocab_size(self) -> int: ...


@dataclass(eq=False)
class Job:
    """One batched request: its plans (one row each, choice indices following on), the consumer's
    cancellation, and where its events go (``send``) and how it ends (``end``, with an error or None)."""

    plans: list[Plan]
    control: StepControl
    send: Callable[[Event], None]
    end: Callable[[BaseException | None], None]
    check: Callable[[], None] | None = None  # between steps: raises when an operator change invalidates it
    rows_left: int = 0
    completion_tokens: int = 0
    session: MonitorSession | None = None
    monitored_sae: str | None = None
    slots: list[int] = field(default_factory=list)

    @property
    def override(self) -> Any:
        return self.plans[0].override

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p.prompt_ids[0]) for p in self.plans)


@dataclass(eq=False)
class BatchRow:
    """One row in a slot: its prompt, how much of it is in the KV, and the token sampled but not fed."""

    job: Job
    row: Row
    slot: int
    prompt: list[int]
    filled: int = 0
    next_token: int | None = None

    @property
    def length(self) -> int:
        """Tokens in the slot's KV; the next fed token goes at this position."""
        return self.filled + self.row.output.tokens - (1 if self.next_token is not None else 0)


class Scheduler:
    """The batch of one engine: KV slots, rows, the waiting requests, and the step that drives them."""

    def __init__(self, engine: BatchEngine, settings: BatchSettings) -> None:
        self.engine = engine
        self.settings = settings
        slots = settings.max_rows
        self.cache = SlotCache(KVShape.of(engine.model.config), slots, settings.slot_len, engine.dtype, engine.device)
        engine.steering.reserve_rows(slots)
        self.rows: dict[int, BatchRow] = {}
        self.free = list(range(slots))
        self.counts = torch.zeros(slots, int(engine.model.config.vocab_size), dtype=torch.int32, device=engine.device)
        self.waiting: deque[Job] = deque()
        self._lock = threading.Lock()
        self._decoded: deque[tuple[float, int]] = deque()  # (time, tokens) of recent decode steps
        self.run_commands: Callable[[], None] = lambda: None

    # any thread
    def submit(self, job: Job) -> None:
        with self._lock:
            self.waiting.append(job)

    @property
    def busy(self) -> bool:
        return bool(self.rows or self.waiting)

    @property
    def active_rows(self) -> int:
        return len(self.rows)

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
        """One scheduling step: commands, retirements, admissions, prefill chunks, one decode."""
        self.run_commands()
        with torch.inference_mode():
            self._check_jobs()
            self._admit()
            self._prefill()
            self._decode()

    def _jobs(self) -> list[Job]:
        return list(dict.fromkeys(r.job for r in self.rows.values()))

    def _check_jobs(self) -> None:
        """End the admitted requests whose consumer left, or whose steering an operator change made invalid."""
        for job in self._jobs():
            if job.control.cancel.is_set():
                self._finish(job, job.control.reason)
                continue
            try:
                self._check(job)
            except Exception as exc:  # this row's steering is invalid now: it ends, the others go on
                self._finish(job, exc)

    def _check(self, job: Job) -> None:
        if job.check is not None:
            job.check()
        errors = self.engine.steering.row_errors
        for slot in job.slots:
            if slot in errors:
                raise errors[slot]

    def _admit(self) -> None:
        """Drop the waiting requests whose consumer left; then start waiting requests while slots are free,
        each checked first, so a request whose steering became invalid while it waited sends no text."""
        with self._lock:
            gone = [job for job in self.waiting if job.control.cancel.is_set()]
            if gone:
                self.waiting = deque(job for job in self.waiting if not job.control.cancel.is_set())
        for job in gone:
            job.end(job.control.reason)
        while self.waiting and len(self.waiting[0].plans) <= len(self.free):
            with self._lock:
                job = self.waiting.popleft()
            try:
                self._check(job)
            except Exception as exc:  # invalid before its first token: it ends, nothing was sent
                job.end(exc)
                continue
            self._start(job)

    def _start(self, job: Job) -> None:
        """Bind each of the job's prompts to a free slot. A failure here (its steering cannot be bound)
        ends this request alone, with every slot it took freed."""
        engine = self.engine
        job.rows_left = len(job.plans)
        try:
            for offset, plan in enumerate(job.plans):
                row = Row(offset, ChoiceOutput(engine.tokenizer, plan.params.stop, engine.stop_ids), plan.params,
                          plan.max_tokens)
                slot = min(self.free)
                self.free.remove(slot)
                self.rows[slot] = BatchRow(job, row, slot, plan.prompt_ids[0])
                job.slots.append(slot)
                self.counts[slot].zero_()
                engine.steering.bind_row(slot, job.override)
            config = engine.monitor.config
            if config.enabled and config.sae in engine.steering.attachments:
                job.session = engine.monitor.session()
                job.session.sae = engine.steering.attachments[config.sae].sae
                job.monitored_sae = config.sae
        except Exception as exc:  # this request's own setup failed: it ends, the others go on
            self._finish(job, exc)

    def _readers(self, rows: list[BatchRow], first: int, writes: torch.Tensor) -> dict[str, list[tuple[int, Any]]]:
        """Each monitored row's reader, per SAE, reading only its row's real positions: a merged prefill's
        padding (the leading queries that write at the cache's aside position) is left out."""
        readers: dict[str, list[tuple[int, Any]]] = {}
        for r in rows:
            if r.job.session is not None and r.job.monitored_sae is not None:
                offset = r.slot - first
                pad = int((writes[offset] == self.cache.aside).sum())
                read = r.job.session if pad == 0 else _trimmed(r.job.session, pad)
                readers.setdefault(r.job.monitored_sae, []).append((offset, read))
        return readers

    def _forward(self, ids: torch.Tensor, first: int, positions: torch.Tensor, rows: list[BatchRow],
                 mask_positions: torch.Tensor | None = None) -> torch.Tensor:
        """Last-position logits (fp32) of one forward over slots ``[first, first + len(ids))``."""
        mask = self.cache.bind(first, positions, mask_positions)
        view = RowView(first, ids.shape[0], self._readers(rows, first, positions))
        with self.engine.steering.rows(view):
            out = self.engine.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=self.cache,
                                    use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :].float()

    def _prefill(self) -> None:
        """Feed waiting prompt chunks of several rows in one forward, at most ``prefill_chunk`` tokens
        (padding included, ``millm.engine.prefill``); a finished prompt samples its first token, a prompt
        that did not fit continues next step. If the forward fails, every row in it ends with the error."""
        pending = sorted((r for r in self.rows.values() if r.filled < len(r.prompt)), key=lambda r: r.slot)
        merged = choose([(r.slot, len(r.prompt) - r.filled) for r in pending], self.settings.prefill_chunk)
        if merged is None:
            return
        rows = [self.rows[slot] for slot in merged.takes]
        feeds = {r.slot: (r.filled, r.prompt[r.filled:r.filled + merged.takes[r.slot]]) for r in rows}
        ids, writes, reads = inputs(merged, feeds, self.engine.pad_id, self.cache.aside)
        device = self.engine.device
        try:
            logits = self._forward(ids.to(device), merged.first, writes.to(device), rows, reads.to(device))
        except Exception as exc:  # the shared forward failed: every row in it ends with the error
            for job in dict.fromkeys(r.job for r in rows):
                self._finish(job, exc)
            return
        for r in rows:
            r.filled += merged.takes[r.slot]
        done = [r for r in rows if r.filled == len(r.prompt)]
        if done:
            self._sample(done, logits[[r.slot - merged.first for r in done]])

    def _decode(self) -> None:
        rows = [r for r in self.rows.values() if r.next_token is not None]
        if not rows:
            return
        high = max(r.slot for r in rows) + 1
        ids = torch.full((high, 1), self.engine.pad_id, dtype=torch.long)
        # a slot not decoding now writes at its last position (never a fed token's) and reads key 0
        writes = torch.full((high, 1), self.cache.aside, dtype=torch.long)
        reads = torch.zeros((high, 1), dtype=torch.long)
        for r in rows:
            assert r.next_token is not None
            ids[r.slot, 0] = r.next_token
            writes[r.slot, 0] = reads[r.slot, 0] = r.length
        device = self.engine.device
        try:
            logits = self._forward(ids.to(device), 0, writes.to(device), rows, reads.to(device))
        except Exception as exc:  # the shared forward failed: every row in it ends with the error
            for job in dict.fromkeys(r.job for r in rows):
                self._finish(job, exc)
            return
        for r in rows:
            r.next_token = None
        self._sample(rows, logits[[r.slot for r in rows]])  # each row's failure is its own
        self._decoded.append((time.monotonic(), len(rows)))
        while self._decoded and time.monotonic() - self._decoded[0][0] > RATE_WINDOW:
            self._decoded.popleft()

    def _sample(self, rows: list[BatchRow], logits: torch.Tensor) -> None:
        """Each row's own penalties, temperature and top_p; then its text, and its end when it ends.

        Every failure is one row's: a row whose logits no token can be drawn from ends alone (before
        anything is drawn), and when the shared draw fails anyway each row is drawn again on its own,
        so only the row that breaks it ends.
        """
        try:
            tokens, rows = self._draw(rows, logits)
        except Exception as exc:
            if len(rows) == 1:
                self._finish(rows[0].job, exc)
                return
            for i, r in enumerate(rows):
                if self.rows.get(r.slot) is r:
                    self._sample([r], logits[i:i + 1])
            return
        for r, token in zip(rows, tokens):
            if self.rows.get(r.slot) is not r:  # its request already ended in this step
                continue
            try:
                r.next_token = token
                for event in emit(r.row, token):
                    r.job.send(event)
                if r.row.done:
                    self._retire(r)
            except Exception as exc:  # this row's own work failed: its request ends, the others go on
                self._finish(r.job, exc)

    def _draw(self, rows: list[BatchRow], logits: torch.Tensor) -> tuple[list[int], list[BatchRow]]:
        """The next token of every row that can have one, and those rows; their counts are updated.
        A row whose logits hold a NaN or +inf, or only -inf, ends here with non_finite_logits."""
        params = [r.row.params for r in rows]
        device = logits.device
        logits = apply_penalties(logits, self.counts[[r.slot for r in rows]],
                                 torch.tensor([p.frequency_penalty for p in params], device=device),
                                 torch.tensor([p.presence_penalty for p in params], device=device))
        for r, broken in zip(rows, unsampleable(logits).tolist()):
            if broken:
                self._finish(r.job, NonFiniteLogits("The model produced NaN or infinite logits for this request; "
                                                    "no next token can be drawn."))
        keep = [i for i, r in enumerate(rows) if self.rows.get(r.slot) is r]
        rows, params = [rows[i] for i in keep], [params[i] for i in keep]
        if not rows:
            return [], []
        tokens = sample_rows(logits[keep], torch.tensor([p.temperature for p in params], device=device),
                             torch.tensor([p.top_p for p in params], device=device))
        slots = [r.slot for r in rows]
        counts = self.counts[slots]
        update_counts(counts, tokens)
        self.counts[slots] = counts
        return tokens.tolist(), rows

    def _retire(self, r: BatchRow) -> None:
        """A row finished: free its slot; the request ends (with its Usage) when its last row does."""
        job = r.job
        self._free(r)
        job.completion_tokens += r.row.output.tokens
        job.rows_left -= 1
        if job.rows_left == 0:
            job.send(Usage(job.prompt_tokens, job.completion_tokens))
            self._commit(job)
            job.end(None)

    def _free(self, r: BatchRow) -> None:
        del self.rows[r.slot]
        self.engine.steering.release_row(r.slot)
        self.free.append(r.slot)

    def _commit(self, job: Job) -> None:
        if job.session is not None:
            self.engine.monitor.commit(job.session, self.engine.model_id)
            job.session = None

    def _finish(self, job: Job, error: BaseException | None) -> None:
        """End a request early (cancelled, or failed): free every row it still holds."""
        for slot in job.slots:
            r = self.rows.get(slot)
            if r is not None and r.job is job:
                self._free(r)
        if job.rows_left > 0:
            job.rows_left = 0
            self._commit(job)
            job.end(error)

    def fail_all(self, error: BaseException) -> None:
        """Something outside any one row broke the step: every admitted and waiting request ends with it."""
        for job in self._jobs():
            self._finish(job, error)
        with self._lock:
            waiting, self.waiting = list(self.waiting), deque()
        for job in waiting:
            job.end(error)


def _trimmed(read: Callable[[torch.Tensor], None], pad: int) -> Callable[[torch.Tensor], None]:
    """``read`` of a row's residual without its ``pad`` leading padding positions."""
    return lambda hidden: read(hidden[:, pad:])
