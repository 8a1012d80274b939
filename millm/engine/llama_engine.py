"""The llama.cpp engine (GGUF files) behind the same interface as the transformers engine.

Chat prompts are rendered with the file's own template; decoding runs llama.cpp's sampler token by
token through miLLM's own stop matching and incremental detokenising, so streams behave the same
on both engines. llama.cpp cannot be scored here, nor its residual read: the field table refuses those.

With MILLM_GGUF_STEERING on, SAEs attach to the model and steer it through llama.cpp's control vectors
(``millm.steering.cvec``): each generation binds the one steering row to its request's own values (or the
live values), writes the row's per-layer sum into the control-vector buffer before its first forward, again
whenever an operator changes it between two tokens, and clears the buffer when it ends, in ``finally``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Generator, Iterator
from typing import Any

from millm.config import Settings
from millm.engine.base import (
    Capabilities,
    NoModelInternals,
    StepControl,
    check_scoring_supported,
    check_supported,
    fingerprint,
)
from millm.engine.chat_tokens import chat_ids, llama_control_tokens, llama_plain
from millm.engine.decode.output import ChoiceOutput
from millm.engine.decode.rows import Row, emit
from millm.engine.events import Event, Steered, Usage
from millm.engine.params import (
    ChatPrompt,
    GenerationRequest,
    Prompt,
    TextPrompt,
    TokenPrompt,
    check_token_ids,
    prompt_names,
)
from millm.engine.plan import Plan, check_characters, run_each, token_budget
from millm.engine.scoring import ScoreRequest, ScoreResult
from millm.engine.templates import END_OF_TURN_TOKENS, fallback_template
from millm.errors import ContextLengthExceeded, InvalidParameter, ModelLoadFailed
from millm.registry import ModelEntry
from millm.steering.target import (
    GENERATED_PHASE,
    PROMPT_PHASE,
    ROW,
    ControlVector,
    ControlVectorSteering,
    Monitor,
    SteeringTarget,
    applies,
)

log = logging.getLogger("millm.llama_cpp")
_log_callback: Any = None

# llama.cpp divides float32 logits by T: below about 1e-37 they overflow into inf and NaN. 1e-30 stays finite
# and samples as near-greedy as any smaller T would, so generation honours the whole 0-2 range here too.
LLAMA_MIN_TEMPERATURE = 1e-30


def route_llama_logs() -> None:
    """Send llama.cpp's own log lines to miLLM's logger at debug level, never to the terminal."""
    global _log_callback
    import llama_cpp

    if _log_callback is None:
        @llama_cpp.llama_log_callback
        def callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
            log.debug("%s", text.decode("utf-8", errors="replace").rstrip())

        _log_callback = callback
    llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))


def gpu_placement(settings: Settings) -> dict[str, Any]:
    """Every layer on the GPU where llama.cpp can offload; with several cards, a tensor split in proportion
    to each card's free memory."""
    import llama_cpp

    if settings.device == "cpu" or not llama_cpp.llama_supports_gpu_offload():
        return {}
    from millm.engine.preflight import free_memory

    free = free_memory("cuda")
    split = [size / sum(free.values()) for size in free.values()] if len(free) > 1 else None
    return {"n_gpu_layers": -1, **({"tensor_split": split} if split else {})}


class _Detokenizer:
    """llama.cpp's detokenizer in the shape IncrementalDetokenizer expects."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.llm.detokenize(ids, special=not skip_special_tokens).decode("utf-8", errors="replace")


class LlamaCppEngine(NoModelInternals):
    """A GGUF model on llama.cpp.

    Like llama.cpp's own server, a prompt that shares a prefix with the previous one reuses its KV
    cache. The prompt's last token is then evaluated alone rather than in a batch, which can change
    greedy output between a cold and a warm cache. A seeded request therefore evaluates its prompt
    cold: measured byte-identical across runs and cache states, so its seed is honoured with
    scope="request".

    Under steering the cache was computed with the control vector of the request that filled it: a prefix is
    reused only by a request that steers exactly alike (``_cache_key``); any other starts cold.
    """

    engine_name = "llama.cpp"
    weights = "dtype"  # a GGUF file's weights are the file's quantization

    def __init__(self, entry: ModelEntry, llm: Any, default_max_tokens: int = 1024, steerable: bool = False) -> None:
        import llama_cpp

        self.entry = entry
        self.llm = llm
        self.default_max_tokens = default_max_tokens
        self.context_window = int(llm.n_ctx())
        self.decoder = _Detokenizer(llm)
        self.max_token_bytes = max((len(llm.detokenize([i], special=True)) for i in range(int(llm.n_vocab()))),
                                   default=1) or 1  # bounds the characters a window holds (check_characters)
        self.stop_ids = self._end_token_ids()
        self.control_tokens = llama_control_tokens(llm)  # only the template's markup may yield these
        self._embedder: Any = None
        self._lock = threading.Lock()
        self.n_layers = int(llama_cpp.llama_model_n_layer(llm.model))
        # control vectors steer (MILLM_GGUF_STEERING); nothing reads llama.cpp's residual or scores here
        self.capabilities = Capabilities(steers=steerable, reads=False, scores=False, seedable=True,
                                         constrainable=False, multiple_choices=False)
        self._steering = ControlVectorSteering(self.n_layers, int(llm.n_embd())) if steerable else None
        self._target = (SteeringTarget(entry.id, self._steering, Monitor(), reads=False)
                        if self._steering is not None else None)
        self._version = -1  # the steering row's version the control vector was last written from
        self._phase = PROMPT_PHASE  # the phase the control vector was last written for (steering_scope)
        self._cache_key: Any = None  # the control vector the cached tokens were computed under (None: none)
        self._uploaded: tuple[int, int, bytes] | None = None  # what llama.cpp's control vector holds now
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        template = llm.metadata.get("tokenizer.chat_template")
        self._formatter = None
        if template:
            token = lambda key: self._special_text(int(llm.metadata.get(key, -1)))  # noqa: E731
            self._formatter = Jinja2ChatFormatter(template, eos_token=token("tokenizer.ggml.eos_token_id"),
                                                  bos_token=token("tokenizer.ggml.bos_token_id"))

    @classmethod
    def load(cls, entry: ModelEntry, settings: Settings) -> LlamaCppEngine:
        from llama_cpp import Llama

        route_llama_logs()
        try:
            llm = Llama(str(entry.path), n_ctx=0, n_threads=os.cpu_count(), verbose=False, **gpu_placement(settings))
        except Exception as exc:  # llama.cpp reports load failures as bare errors
            raise ModelLoadFailed(f"llama.cpp could not load '{entry.id}' from {entry.path}: {exc}") from exc
        return cls(entry, llm, settings.default_max_tokens, steerable=settings.gguf_steering)

    def close(self) -> None:
        if self._target is not None:
            self._target.steering.detach_all()
        for llm in (self.llm, self._embedder):
            if llm is not None:
                llm.close()

    @property
    def model_id(self) -> str:
        return self.entry.id

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.entry.repo, self.entry.revision, None, self.entry.quantization, self.engine_name)

    @property
    def vocab_size(self) -> int:
        return int(self.llm.n_vocab())

    def token_text(self, token_id: int) -> str:
        return self.decoder.decode([token_id])

    def steering_target(self) -> SteeringTarget | None:
        """The control-vector steering under MILLM_GGUF_STEERING; else None (llama.cpp has no SAE hooks)."""
        return self._target

    def score(self, request: ScoreRequest) -> list[ScoreResult]:
        check_scoring_supported(request, self.capabilities, self.engine_name)
        raise AssertionError("llama.cpp cannot score")  # pragma: no cover: the check always refuses

    def _special_text(self, token_id: int) -> str:
        return "" if token_id < 0 else self.llm.detokenize([token_id], special=True).decode("utf-8", errors="replace")

    def _end_token_ids(self) -> frozenset[int]:
        ids = {self.llm.token_eos()}
        for text in END_OF_TURN_TOKENS:
            found = self.llm.tokenize(text.encode(), add_bos=False, special=True)
            if len(found) == 1 and self._special_text(found[0]) == text:
                ids.add(found[0])
        return frozenset(ids)

    def _render(self, messages: list[dict[str, Any]]) -> str:
        if self._formatter is None:
            return fallback_template(messages, True)
        return str(self._formatter(messages=messages).prompt)  # type: ignore[arg-type]

    def _render_continued(self, messages: list[dict[str, Any]]) -> str:
        """A trailing assistant message is continued, not closed."""
        if messages[-1]["role"] == "assistant":
            return self._render(messages[:-1]) + messages[-1]["content"]
        return self._render(messages)

    def tokenize(self, prompt: Prompt) -> list[int]:
        """Chat prompts through the file's template (control tokens from its markup only)."""
        if isinstance(prompt, TokenPrompt):
            return check_token_ids(prompt, self.vocab_size)
        if isinstance(prompt, ChatPrompt):
            return chat_ids(lambda m, _: self._render_continued(m), prompt.messages, {}, self.control_tokens,
                            llama_plain(self.llm))
        return self.llm.tokenize(prompt.text.encode(), add_bos=prompt.add_special_tokens, special=True)

    def prepare(self, request: GenerationRequest) -> Plan:
        """Tokenise and check against the context window (400, never llama.cpp's bare error)."""
        check_supported(request, self.capabilities, self.engine_name)
        check_characters(request.prompts, prompt_names(request.prompts), self.context_window, self.max_token_bytes)
        prompt_ids = [self.tokenize(p) for p in request.prompts]
        return Plan(prompt_ids, request.params,
                    token_budget(prompt_ids, request.params.max_tokens, self.context_window, self.default_max_tokens,
                              prompt_names(request.prompts)), steering=request.steering, scope=request.scope)

    def generate(self, request: GenerationRequest, control: StepControl | None = None) -> Iterator[Event]:
        return self.run(self.prepare(request), control)

    def run_all(self, plans: list[Plan], control: StepControl | None = None) -> Iterator[Event]:
        """Prepared plans one after another (llama.cpp decodes one sequence at a time here), as one stream."""
        return run_each(self.run, plans, control)

    def run(self, plan: Plan, control: StepControl | None = None) -> Iterator[Event]:
        """Each prompt of the plan in turn (llama.cpp decodes one sequence here), steered by the plan's
        own values (else the live values) when steering is on; the control vector is cleared afterwards."""
        with self._lock:
            steering = self._steering
            if steering is not None:
                steering.bind_row(ROW, plan.steering, plan.scope)
            try:
                if steering is not None:
                    yield Steered(steering.label(plan.steering))
                completion = 0
                for index, ids in enumerate(plan.prompt_ids):
                    row = Row(index, ChoiceOutput(self.decoder, plan.params.stop, self.stop_ids), plan.params,
                              plan.max_tokens)
                    self._steer_prompt()
                    cancelled = yield from self._seeded(ids, row, control)
                    completion += row.output.tokens
                    if cancelled:
                        return
                yield Usage(sum(len(ids) for ids in plan.prompt_ids), completion)
            finally:
                if steering is not None:
                    steering.release_row(ROW)
                self._upload(None)

    # steering
    def _vector(self, phase: int) -> ControlVector | None:
        """The row's control vector for a forward of ``phase``: None where its steering scope leaves that
        phase unsteered (``generated`` prefills without it, ``prompt`` decodes without it)."""
        steering = self._steering
        if steering is None or not applies(steering.row_scope(ROW), phase):
            return None
        return steering.vector(ROW)

    def _upload(self, vector: ControlVector | None) -> None:
        """Write ``vector`` into llama.cpp's control-vector buffer (None: clear it, data NULL)."""
        import llama_cpp

        key = vector.key() if vector is not None else None
        if key == self._uploaded:
            return
        if vector is None:
            rc = llama_cpp.llama_set_adapter_cvec(self.llm.ctx, None, 0, int(self.llm.n_embd()), -1, -1)
        else:
            data = vector.data.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            rc = llama_cpp.llama_set_adapter_cvec(self.llm.ctx, data, vector.data.size, int(self.llm.n_embd()),
                                                  vector.il_start, vector.il_end)
        if rc != 0:
            raise RuntimeError(f"llama.cpp refused the control vector (llama_set_adapter_cvec returned {rc}).")
        self._uploaded = key

    def _steer_prompt(self) -> None:
        """Before a row's first forward: its control vector in place, and the cached prefix dropped unless it
        was computed under this same vector (never reused across a steering change)."""
        if self._steering is None:
            return
        vector = self._vector(PROMPT_PHASE)
        key = vector.key() if vector is not None else None
        if key != self._cache_key:
            self.llm.reset()
            self._cache_key = key
        self._upload(vector)
        self._version, self._phase = self._steering.version, PROMPT_PHASE

    def _steer_step(self) -> None:
        """Between two tokens: the row's decode-phase vector (its scope may steer the prompt only, or the
        generated tokens only), and an operator change to the row (rows that follow the live values), reach the
        next forward; the cache then holds tokens of two steerings, so no later request reuses it. A row whose
        own steering no longer fits the attached SAEs ends here with its error."""
        steering = self._steering
        if steering is None:
            return
        error = steering.row_errors.get(ROW)
        if error is not None:
            raise error
        if steering.version == self._version and self._phase == GENERATED_PHASE:
            return
        self._version, self._phase = steering.version, GENERATED_PHASE  # the next forward feeds a generated token
        vector = self._vector(GENERATED_PHASE)
        key = vector.key() if vector is not None else None
        if key != self._uploaded:
            self._upload(vector)
            self._cache_key = object()  # equal to no vector: the next request starts cold

    def _seeded(self, ids: list[int], row: Row, control: StepControl | None) -> Generator[Event, None, bool]:
        """A seeded row evaluates its prompt cold (no prefix reuse) with its own sampler seed, so the same
        seed gives the same text whatever ran before; unseeded rows keep llama.cpp's prefix reuse."""
        seed = row.params.seed
        if seed is None:
            return (yield from self._decode(ids, row, control))
        previous = self.llm._seed
        self.llm.reset()
        self.llm.set_seed(seed)
        try:
            return (yield from self._decode(ids, row, control))
        finally:
            self.llm.set_seed(previous)

    def _decode(self, ids: list[int], row: Row, control: StepControl | None) -> Generator[Event, None, bool]:
        """Yield the row's events; return True when the consumer went away."""
        p = row.params
        temp = max(p.temperature, LLAMA_MIN_TEMPERATURE) if p.temperature > 0 else 0.0
        tokens = self.llm.generate(ids, temp=temp, top_p=p.top_p, top_k=0, min_p=0.0, repeat_penalty=1.0,
                                   frequency_penalty=p.frequency_penalty, presence_penalty=p.presence_penalty)
        try:
            for token in tokens:
                yield from emit(row, token)
                if row.done:
                    return False
                if control is not None and control.between_steps():
                    return True
                self._steer_step()
        finally:
            tokens.close()
        return False

    def embed(self, inputs: list[Any]) -> tuple[list[list[float]], int]:
        """Mean-pooled last hidden layer, from a second llama.cpp context made for embeddings."""
        from llama_cpp import LLAMA_POOLING_TYPE_MEAN, Llama

        texts, total = [], 0
        for i, item in enumerate(inputs):
            where = "input" if len(inputs) == 1 else f"input[{i}]"
            if not isinstance(item, str):
                raise InvalidParameter(f"'{where}': token-id input is available on the transformers engine only.",
                                       param=where)
            check_characters([TextPrompt(item)], [where], self.context_window, self.max_token_bytes)
            count = len(self.llm.tokenize(item.encode(), add_bos=True, special=True))
            if not item:
                raise InvalidParameter(f"'{where}' is empty.", param=where)
            if count > self.context_window:
                raise ContextLengthExceeded(requested=count, available=self.context_window, param=where)
            texts.append(item)
            total += count
        with self._lock:
            if self._embedder is None:
                route_llama_logs()
                # one batch holds a whole input up to the window: llama.cpp's default 512 would cut it
                window = self.context_window
                self._embedder = Llama(str(self.entry.path), n_ctx=window, n_batch=window, n_ubatch=window,
                                       embedding=True, pooling_type=LLAMA_POOLING_TYPE_MEAN,
                                       n_threads=os.cpu_count(), verbose=False)
            vectors = [list(self._embedder.embed(text, truncate=False)) for text in texts]
        return vectors, total
