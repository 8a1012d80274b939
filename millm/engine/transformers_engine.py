"""The transformers engine: a HuggingFace causal LM; generation decodes in its scheduler
(``millm.engine.decode.scheduler``), scoring and embeddings run cacheless forwards with every SAE hook suppressed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from typing import Any

import torch

from millm.config import Settings
from millm.engine import loader
from millm.engine.base import Capabilities, StepControl, check_scoring_supported, fingerprint
from millm.engine.chat_tokens import chat_ids, hf_control_tokens, hf_plain
from millm.engine.decode.admission import BatchSettings
from millm.engine.decode.detok import token_texts
from millm.engine.decode.driver import drive
from millm.engine.decode.scheduler import Job, Scheduler
from millm.engine.events import Event
from millm.engine.params import (
    ChatPrompt,
    Forced,
    GenerationRequest,
    Prompt,
    TextPrompt,
    TokenPrompt,
    check_token_ids,
    prompt_names,
)
from millm.engine.plan import Plan, check_characters, token_budget, tool_listing
from millm.engine.reproducible import ensure_reproducible_cpu
from millm.engine.scoring import (
    ScoreRequest,
    ScoreResult,
    check_in_vocab,
    echo_result,
    same_forward,
    score_row,
    watched,
)
from millm.engine.shared_prefix import SHARED_MIN, batches, common_prefix, shareable, shared_forward
from millm.engine.templates import END_OF_TURN_TOKENS, has_chat_template, render_chat
from millm.engine.weights import INT8, weights_of
from millm.errors import ContextLengthExceeded, InvalidParameter, InvalidScoringRequest, MillmError, NoChatTemplate
from millm.registry import ModelEntry
from millm.steering.target import (
    UNSTEERED,
    Monitor,
    ReadoutRecorder,
    RequestSteering,
    Steering,
    SteeringTarget,
    bind_readout,
)
from millm.structured.constraint import ConstraintCompiler

EMBED_BATCH = 32


def longest_token_bytes(tokenizer: Any) -> int:
    """The most UTF-8 bytes one token decodes to (a token that is part of a character decodes to U+FFFD, three
    bytes, more than its share): what bounds the characters a window of tokens can hold."""
    pieces = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    return max((len(piece.encode()) for piece in pieces), default=1) or 1


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def model_inputs(ids: torch.Tensor, mask: torch.Tensor | None) -> dict[str, Any]:
    """A cacheless forward's inputs for left-padded ``ids``: with padding, the mask and positions that count
    from each row's first real token."""
    if mask is None:
        return {"input_ids": ids}
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


class TransformersEngine:
    """A loaded HuggingFace causal LM behind miLLM's engine interface."""

    engine_name = "transformers"
    capabilities = Capabilities(steers=True, reads=True, scores=True, seedable=True, constrainable=True,
                                multiple_choices=True, batchable=True)

    def __init__(self, entry: ModelEntry, model: Any, tokenizer: Any, device: torch.device,
                 dtype: torch.dtype, default_max_tokens: int = 1024) -> None:
        self.entry = entry
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.dtype = dtype
        self.weights = weights_of(model)  # "int8": the decoder layers' linears in 8 bits (millm.engine.weights)
        self.default_max_tokens = default_max_tokens
        self.context_window = int(getattr(model.config, "max_position_embeddings", None)
                                  or tokenizer.model_max_length)
        self.max_token_bytes = longest_token_bytes(tokenizer)
        self.stop_ids = self._end_token_ids()
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.stop_ids, default=0)
        self._lock = threading.Lock()  # one forward-running call at a time (the worker's batch steps never take it)
        self._scheduler: Scheduler | None = None
        self.steering = Steering(model)
        self.monitor = Monitor()
        self.constraints = ConstraintCompiler(tokenizer)
        self.control_tokens = hf_control_tokens(tokenizer)  # only the template's markup may yield these
        self._target = SteeringTarget(entry.id, self.steering, self.monitor, reads=self.capabilities.reads)

    def close(self) -> None:
        """Remove every hook and the batch's KV slots before the model goes away."""
        self.steering.detach_all()
        self._scheduler = None

    def batch_scheduler(self, settings: BatchSettings | None) -> Scheduler:
        """This model's scheduler, batching with ``settings`` (None: every request served alone). Made again
        when the settings change while it is idle (its shared KV slots are allocated here)."""
        if self._scheduler is None or (self._scheduler.settings != settings and not self._scheduler.busy):
            self._scheduler = Scheduler(self, settings)
        return self._scheduler

    def scheduler(self) -> Scheduler:
        """The scheduler as it is (serial when none was asked for yet): the one decode loop of this engine."""
        return self._scheduler if self._scheduler is not None else self.batch_scheduler(None)

    @classmethod
    def load(cls, entry: ModelEntry, settings: Settings) -> TransformersEngine:
        """Load ``entry``; MKL is put in its reproducible mode and OpenMP's dynamic mode turned off first where nothing
        has (``millm.engine.reproducible``: on the CPU, a forward's numbers then do not depend on its threads)."""
        ensure_reproducible_cpu()
        model, tokenizer, device, dtype = loader.load(entry, settings)
        return cls(entry, model, tokenizer, device, dtype, settings.default_max_tokens)

    @property
    def model_id(self) -> str:
        return self.entry.id

    @property
    def fingerprint(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.") + ("+int8" if self.weights == INT8 else "")
        return fingerprint(self.entry.id, self.entry.revision, dtype, self.entry.quantization, self.engine_name)

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def token_text(self, token_id: int) -> str:
        return str(self.tokenizer.decode([token_id]))

    def steering_target(self) -> SteeringTarget:
        return self._target

    def _end_token_ids(self) -> frozenset[int]:
        """EOS ids from the tokenizer and generation config, plus the chat template's end-of-turn tokens."""
        ids = set(_as_list(self.tokenizer.eos_token_id))
        gen_config = getattr(self.model, "generation_config", None)
        ids.update(_as_list(getattr(gen_config, "eos_token_id", None)))
        vocab = self.tokenizer.get_vocab()
        ids.update(vocab[t] for t in END_OF_TURN_TOKENS if t in vocab)
        return frozenset(ids)

    def tokenize(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt: chat prompts through the template (which carries its own BOS)."""
        if isinstance(prompt, TokenPrompt):
            return check_token_ids(prompt, self.vocab_size)
        if isinstance(prompt, ChatPrompt):
            return chat_ids(lambda m, kw: render_chat(self.tokenizer, m, kw), prompt.messages,
                            prompt.template_kwargs, self.control_tokens, hf_plain(self.tokenizer))
        return self.tokenizer(prompt.text, add_special_tokens=prompt.add_special_tokens)["input_ids"]

    def prepare(self, request: GenerationRequest) -> Plan:
        """Tokenise and check the request against the context window; raises before any compute."""
        check_characters(request.prompts, prompt_names(request.prompts), self.context_window, self.max_token_bytes)
        prompt_ids = [self.tokenize(p) for p in request.prompts]
        budget = token_budget(prompt_ids, request.params.max_tokens, self.context_window, self.default_max_tokens,
                              prompt_names(request.prompts),
                              lambda i: tool_listing(request.prompts[i], len(prompt_ids[i]), self.tokenize))
        readout = None
        if request.readout is not None:
            readout = bind_readout(request.readout, self.steering, rows=len(prompt_ids) * request.params.n,
                                   prompt_tokens=max(len(ids) for ids in prompt_ids), max_tokens=budget)
        return Plan(prompt_ids, request.params, budget, request.steering, readout, request.constraint, request.scope,
                    request.probes)

    def generate(self, request: GenerationRequest, control: StepControl | None = None) -> Iterator[Event]:
        """Stream Delta and Finish events per choice, then one Usage.

        Closing the iterator, or cancelling ``control`` (checked once per decode step), stops generation.
        """
        return self.run(self.prepare(request), control)

    def run(self, plan: Plan, control: StepControl | None = None) -> Iterator[Event]:
        """Decode a prepared plan on this thread, alone (the serial path), through this engine's scheduler."""
        return self.run_all([plan], control)

    def run_all(self, plans: list[Plan], control: StepControl | None = None) -> Iterator[Event]:
        """Decode prepared plans as one request on this thread, alone in a lane of their own: every row of every
        plan decodes in one batch, each with its own sampling, seed and steering; choice indices follow on,
        plan by plan, and one Usage ends it.

        The engine lock is held for each step, not between them, so another caller on this thread (a
        scoring pass between two chunks of a stream) is not locked out."""
        job = Job(plans, control or StepControl(), lambda _: None, lambda _: None, alone=True)
        return drive(self.scheduler(), job, self._lock)

    def _left_pad(self, prompt_ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor | None]:
        width = max(len(ids) for ids in prompt_ids)
        if all(len(ids) == width for ids in prompt_ids):
            return torch.tensor(prompt_ids, device=self.device), None
        ids = torch.full((len(prompt_ids), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
        for r, row in enumerate(prompt_ids):
            ids[r, width - len(row):] = torch.tensor(row)
            mask[r, width - len(row):] = 1
        return ids.to(self.device), mask.to(self.device)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor | None, keep: int = 1) -> torch.Tensor:
        """The logits (fp32, ``[rows, keep, vocab]``) of a cacheless forward at the last ``keep`` positions. With
        padding, positions come from the mask."""
        out = self.model(use_cache=False, logits_to_keep=keep, **model_inputs(ids, mask))
        return out.logits[:, -keep:].float()

    def score(self, request: ScoreRequest) -> list[ScoreResult]:
        """Next-token log-probabilities per row; never steered or monitored (every hook is suppressed). With a
        read-out, the SAE's activations of this unsteered pass are read at its layer and carried by the row."""
        check_scoring_supported(request, self.capabilities, self.engine_name)
        prompt_ids = []
        for row in request.rows:
            if isinstance(row.prompt, ChatPrompt) and not has_chat_template(self.tokenizer):
                raise NoChatTemplate(f"'{self.model_id}' has no chat template, so chat scoring would score a prompt "
                                     "it was never trained on; use /v1/completions with the prompt you mean.")
            check_in_vocab(row.params, self.vocab_size)
            check_characters([row.prompt], [row.where], self.context_window, self.max_token_bytes)
            prompt_ids.append(self.tokenize(row.prompt))
        if request.readout is None:
            results = self._score(prompt_ids, request)
        else:
            spec = replace(bind_readout(request.readout, self.steering, rows=len(prompt_ids),
                                        prompt_tokens=len(prompt_ids[0]), max_tokens=0), read_point=UNSTEERED)
            recorder = ReadoutRecorder(spec, self.steering, self.token_texts)
            with self.steering.reading_unsteered(spec.sae_id, recorder):
                results = self._score(prompt_ids, request)
            results[0] = replace(results[0], readout=recorder.result(prompt_ids[0], len(prompt_ids[0])))
        return [replace(r, prompt_ids=tuple(ids)) for r, ids in zip(results, prompt_ids)]

    def token_texts(self, ids: list[int]) -> list[str]:
        """Each token's text in context (a read-out's ``token_text``)."""
        return token_texts(self.tokenizer, ids)

    def _score(self, prompt_ids: list[list[int]], request: ScoreRequest) -> list[ScoreResult]:
        if any(row.params.echo for row in request.rows):
            return self._echo(prompt_ids, request)
        if not request.one_at_a_time:
            logits = self.next_token_logits(prompt_ids, [r.where for r in request.rows], request.batch_size)
            return [score_row(lg, row.params, len(ids)) for lg, row, ids in zip(logits, request.rows, prompt_ids)]
        results = []
        for k, (row, ids) in enumerate(zip(request.rows, prompt_ids)):
            try:
                results.append(score_row(self.next_token_logits([ids], [row.where])[0], row.params, len(ids)))
            except MillmError as exc:
                exc.message, exc.param = f"Conversation {k} ({row.where}): {exc.message}", row.where
                exc.args = (exc.message,)
                raise
        return results

    def _echo(self, prompt_ids: list[list[int]], request: ScoreRequest) -> list[ScoreResult]:
        """Every prompt token's log-probability given those before it (from each row's ``echo_from``; the tokens
        before it are listed without one), and the next token, in padded batches: logits are computed only at
        the positions asked for, and reduced batch by batch, never kept whole."""
        self._check_scorable(prompt_ids, [r.where for r in request.rows])
        share = request.readout is None and shareable(self.model.config)  # a read-out records one whole forward
        starts = [min(max(row.echo_from, 1), len(ids)) for ids, row in zip(prompt_ids, request.rows)]
        groups = batches(prompt_ids, [f - 1 for f in starts], request.batch_size, share)
        results: dict[int, ScoreResult] = {}
        with self._lock, torch.inference_mode(), self.steering.suppressed():
            for picked in groups:
                logits = self._echo_logits([prompt_ids[i] for i in picked], [starts[i] for i in picked], share)
                for i, row_logits in zip(picked, logits):
                    results[i] = echo_result(prompt_ids[i], row_logits, request.rows[i].params, starts[i])
        return [results[i] for i in range(len(prompt_ids))]

    def _echo_logits(self, chunk: list[list[int]], froms: list[int], share: bool) -> torch.Tensor:
        """The chunk's logits at each row's positions from its ``froms - 1`` on; with ``share``, the tokens every
        row starts with (before any of those positions) run once when there are enough of them."""
        keep = max(len(ids) - f for ids, f in zip(chunk, froms)) + 1
        shared = min(common_prefix(chunk), min(froms) - 1) if share else 0
        if len(chunk) > 1 and shared >= SHARED_MIN:
            return shared_forward(self.model, chunk[0][:shared], model_inputs(*self._left_pad(
                [ids[shared:] for ids in chunk])), keep)
        batch, mask = self._left_pad(chunk)
        return self._forward(batch, mask, keep=keep)

    def forced(self, reads: list[Forced], batch_size: int = 16) -> list[list[float]]:
        """Per read, the probability of its ``watch`` tokens at each of its answer positions, in left-padded
        batches, each row steered by its own values alone (live values and other requests' rows untouched):
        what the screen estimates a feature's effect from without sampling. Unsteered reads of the same tokens
        run once (the screen reads the same answers unsteered for every feature's words)."""
        self._check_scorable([list(r.ids) for r in reads], [f"reads[{i}]" for i in range(len(reads))])
        groups = same_forward(reads)
        out: list[list[float]] = [[] for _ in reads]
        with self._lock, torch.inference_mode():
            for at in range(0, len(groups), batch_size):
                chunk = groups[at:at + batch_size]
                for row, members in zip(self._forced_logits([reads[m[0]] for m in chunk]), chunk):
                    for i in members:
                        out[i] = watched(row, len(reads[i].ids) - reads[i].start, reads[i].watch)
        return out

    def _forced_logits(self, heads: list[Forced]) -> torch.Tensor:
        """fp32 logits of one left-padded batch of reads, each steered by its own values, over the positions
        that predict the longest answer (left padding: every answer ends at the end)."""
        ids, mask = self._left_pad([list(r.ids) for r in heads])
        keep = max(len(r.ids) - r.start for r in heads) + 1
        unsteered = RequestSteering("unsteered", {})
        alone = [r.steering if r.steering is not None and r.steering.values is not None else unsteered for r in heads]
        with self.steering.each_row(alone):
            return self.model(use_cache=False, logits_to_keep=keep, **model_inputs(ids, mask)).logits.float()

    def residuals(self, reads: list[Forced], layer: int, position: str = "mean",
                  batch_size: int = 16) -> torch.Tensor:
        """``[len(reads), d_model]`` (fp32, CPU): the residual stream after decoder layer ``layer`` (where SAEs
        hook) for each read's ``ids``, averaged over its answer positions (``start`` on) or taken at its last,
        unsteered (every hook suppressed): what steering vectors are learned from. ``all``: every answer position
        of every read, one after another (``[sum of answer lengths, d_model]``: what probes are calibrated on)."""
        from millm.sae.activations import captured_output

        if not 0 <= layer < (layers := self.steering.n_layers):
            raise InvalidParameter(f"'layer' must be between 0 and {layers - 1}, got {layer}.", param="layer")
        self._check_scorable([list(r.ids) for r in reads], [f"reads[{i}]" for i in range(len(reads))])
        rows: list[torch.Tensor] = []
        with self._lock, torch.inference_mode(), self.steering.suppressed():
            for at in range(0, len(reads), batch_size):
                chunk = reads[at:at + batch_size]
                ids, mask = self._left_pad([list(r.ids) for r in chunk])
                hidden = captured_output(self.model, layer, partial(self.model, use_cache=False,
                                                                    **model_inputs(ids, mask)))
                for row, r in zip(hidden.float().cpu(), chunk):
                    span = row[-(len(r.ids) - r.start):] if position != "last" else row[-1:]
                    rows.append(span if position == "all" else span.mean(0, keepdim=True))
        return torch.cat(rows)

    def unembed(self, direction: torch.Tensor) -> torch.Tensor:
        """``[vocab]`` logits (fp32, CPU) of ``direction`` through the output embedding, without the final norm:
        the logit lens of a steering vector, the tokens that adding it to the residual promotes."""
        weight = self.model.get_output_embeddings().weight
        if direction.shape != (width := int(weight.shape[-1]),):
            raise InvalidParameter(f"'direction' must be a vector of the model's width {width}, got shape "
                                   f"{list(direction.shape)}.", param="direction")
        with torch.inference_mode():
            return (weight @ direction.to(weight.device, weight.dtype)).float().cpu()

    def _check_scorable(self, prompt_ids: list[list[int]], names: list[str]) -> None:
        for ids, where in zip(prompt_ids, names):
            if not ids:
                raise InvalidScoringRequest(f"'{where}' tokenises to nothing; there is no position to score.",
                                            param=where)
            if len(ids) + 1 > self.context_window:
                raise ContextLengthExceeded(requested=len(ids) + 1, available=self.context_window,
                                            prompt_tokens=len(ids), param=where)

    def next_token_logits(self, prompt_ids: list[list[int]], names: list[str], batch_size: int = 32) -> torch.Tensor:
        """Last-position logits ``[len(prompt_ids), vocab]`` (fp32, CPU), in left-padded batches.

        Scoring: every SAE hook is suppressed, so nothing steers or records these passes.
        """
        self._check_scorable(prompt_ids, names)
        rows = []
        with self._lock, torch.inference_mode(), self.steering.suppressed():
            for start in range(0, len(prompt_ids), batch_size):
                batch, mask = self._left_pad(prompt_ids[start:start + batch_size])
                rows.append(self._forward(batch, mask)[:, -1].cpu())
        return torch.cat(rows)

    def embed(self, inputs: list[Any]) -> tuple[list[list[float]], int]:
        """Masked mean of the last hidden layer per input (text, or this model's token ids), and the
        total token count. Never steered."""
        encoded = [self._embedding_ids(item, "input" if len(inputs) == 1 else f"input[{i}]")
                   for i, item in enumerate(inputs)]
        vectors: list[list[float]] = []
        with self._lock, torch.inference_mode(), self.steering.suppressed():
            decoder = self.model.get_decoder()
            for start in range(0, len(encoded), EMBED_BATCH):
                vectors += self._mean_hidden(decoder, encoded[start:start + EMBED_BATCH])
        return vectors, sum(len(ids) for ids in encoded)

    def _embedding_ids(self, item: Any, where: str) -> list[int]:
        """One embedding input as this model's token ids: a text tokenized (its characters checked first), or ids
        checked to lie in this model's vocabulary; never empty, never past the context window."""
        vocab = len(self.tokenizer)
        if isinstance(item, str):
            check_characters([TextPrompt(item)], [where], self.context_window, self.max_token_bytes)
            ids = self.tokenizer(item, add_special_tokens=True)["input_ids"]
        elif past := [t for t in item if t >= vocab]:
            # what LangChain's OpenAIEmbeddings sends by default: the text as tiktoken's ids, not this model's
            raise InvalidParameter(
                f"'{where}' holds token id {past[0]}, past this model's vocabulary (0-{vocab - 1}): these look "
                "like another tokenizer's ids (for example tiktoken's, which LangChain's OpenAIEmbeddings sends "
                "by default), which stand for other tokens here. Send the text itself; with LangChain, pass "
                "check_embedding_ctx_length=False to OpenAIEmbeddings.", param=where)
        elif any(t < 0 for t in item):
            raise InvalidParameter(f"'{where}' holds a token id outside this model's vocabulary (0-{vocab - 1}).",
                                   param=where)
        else:
            ids = list(item)
        if not ids:
            raise InvalidParameter(f"'{where}' is empty.", param=where)
        if len(ids) > self.context_window:
            raise ContextLengthExceeded(requested=len(ids), available=self.context_window, param=where)
        return ids

    def _mean_hidden(self, decoder: Any, chunk: list[list[int]]) -> list[list[float]]:
        """The masked mean of ``decoder``'s last hidden layer for each row of ``chunk``, the rows right-padded to
        the longest (the caller holds the lock, in inference mode, steering suppressed)."""
        width = max(len(ids) for ids in chunk)
        ids = torch.tensor([row + [self.pad_id] * (width - len(row)) for row in chunk], device=self.device)
        mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in chunk], device=self.device)
        hidden = decoder(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return ((hidden * weights).sum(1) / weights.sum(1)).tolist()
