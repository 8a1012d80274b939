"""A scripted engine behind the engine interface: the wire contract tested in milliseconds, no torch.

Its tokens are characters of a fixed vocabulary; it answers every prompt with the same scripted
text, decoding one character per step through the real per-row ``emit`` rule, so stops, hold-back,
lengths and cancellation behave exactly as on a real engine.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from millm.engine.base import Capabilities, StepControl, check_scoring_supported, check_supported, fingerprint
from millm.engine.decode.output import ChoiceOutput
from millm.engine.decode.rows import Row, emit
from millm.engine.events import Event, Usage
from millm.engine.params import ChatPrompt, Forced, GenerationRequest, Prompt, TokenPrompt, prompt_names
from millm.engine.plan import Plan, check_characters, run_each, token_budget
from millm.engine.scoring import ScoreRequest, ScoreResult, TokenScore, check_in_vocab
from millm.errors import FieldNotHonoured, InvalidScoringRequest
from millm.registry import ModelEntry

VOCAB = ["<eos>"] + [chr(c) for c in range(32, 127)] + ["\n"]  # newline last: earlier ids unchanged
SCRIPT = "Hello from the fake engine. It says the same thing every time, one character per step."
FULL = Capabilities(steers=False, reads=False, scores=True, seedable=True, constrainable=True,
                    multiple_choices=True)
GGUF = Capabilities(steers=False, reads=False, scores=False, seedable=False, constrainable=False,
                    multiple_choices=False)


class CharDecoder:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(VOCAB[i] for i in ids if i != 0)


class FakeEngine:
    """Answers SCRIPT (then EOS) to everything; ``gate`` holds each step until set; ``steps`` counts them."""

    def __init__(self, model_id: str = "fake", engine_name: str = "transformers", script: str = SCRIPT,
                 context_window: int = 4096) -> None:
        self.engine_name = engine_name
        self.capabilities = FULL if engine_name == "transformers" else GGUF
        self.entry = ModelEntry(id=model_id, engine=engine_name, source="path", path=Path(__file__))
        self.context_window = context_window
        self.max_token_bytes = max(len(t.encode()) for t in VOCAB)
        self.script = [VOCAB.index(ch) for ch in script] + [0]
        self.gate = threading.Event()
        self.gate.set()
        self.steps = 0
        self.pause_after: int | None = None  # clear ``gate`` once this many steps have run
        self.fail_at: tuple[int, Exception] | None = None  # raise this exception at that step
        self.started = threading.Event()
        self.closed = False

    @property
    def model_id(self) -> str:
        return self.entry.id

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.entry.id, None, "float32", None, self.engine_name)

    @property
    def vocab_size(self) -> int:
        return len(VOCAB)

    def tokenize(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, TokenPrompt):
            return list(prompt.ids)
        text = "".join(m["content"] for m in prompt.messages) if isinstance(prompt, ChatPrompt) else prompt.text
        return [VOCAB.index(ch) if ch in VOCAB else 1 for ch in text]

    def token_text(self, token_id: int) -> str:
        return VOCAB[token_id]

    def prepare(self, request: GenerationRequest) -> Plan:
        check_supported(request, self.capabilities, self.engine_name)
        check_characters(request.prompts, prompt_names(request.prompts), self.context_window, self.max_token_bytes)
        ids = [self.tokenize(p) for p in request.prompts]
        budget = token_budget(ids, request.params.max_tokens, self.context_window, 64, prompt_names(request.prompts))
        return Plan(ids, request.params, budget,
                    constraint=request.constraint)

    def generate(self, request: GenerationRequest, control: StepControl | None = None) -> Iterator[Event]:
        return self.run(self.prepare(request), control)

    def run_all(self, plans: list[Plan], control: StepControl | None = None) -> Iterator[Event]:
        return run_each(self.run, plans, control)

    def run(self, plan: Plan, control: StepControl | None = None) -> Iterator[Event]:
        self.started.set()
        count = len(plan.prompt_ids) * plan.params.n
        rows = [Row(i, ChoiceOutput(CharDecoder(), plan.params.stop, frozenset({0})), plan.params, plan.max_tokens)
                for i in range(count)]
        for step in range(plan.max_tokens):
            while not self.gate.wait(0.01):  # a held step still ends when the request is cancelled
                if control is not None and control.cancel.is_set():
                    break
            if control is not None and control.between_steps():
                return
            self.steps += 1
            if self.fail_at is not None and self.steps == self.fail_at[0]:
                raise self.fail_at[1]
            if self.steps == self.pause_after:
                self.gate.clear()
            for row in rows:
                if not row.done:
                    yield from emit(row, self.script[min(step, len(self.script) - 1)])
            if all(row.done for row in rows):
                break
        yield Usage(sum(len(ids) for ids in plan.prompt_ids), sum(r.output.tokens for r in rows))

    def score(self, request: ScoreRequest) -> list[ScoreResult]:
        check_scoring_supported(request, self.capabilities, self.engine_name)
        results = []
        for row in request.rows:
            check_in_vocab(row.params, self.vocab_size)
            ids = self.tokenize(row.prompt)
            if not ids:
                raise InvalidScoringRequest(f"'{row.where}' tokenises to nothing.", param=row.where)
            allowed = row.params.allowed or tuple(range(1, 4))
            top = [TokenScore(t, -float(i + 1)) for i, t in enumerate(allowed)]
            results.append(ScoreResult(top[0], top, len(ids)))
        return results

    def forced(self, reads: list[Forced], batch_size: int = 16) -> list[list[float]]:
        """Teacher-forced reads need the residual and the distribution, which the scripted engine does not expose."""
        raise FieldNotHonoured("Teacher-forced reads (the screen's estimate) need a transformers model.", param="model")

    def residuals(self, reads: list[Forced], layer: int, position: str = "mean",
                  batch_size: int = 16) -> Any:
        """Residual reads (learning a steering vector) need the model's layers, which the scripted engine lacks."""
        raise FieldNotHonoured("Learning a steering vector reads the residual stream: it needs a transformers "
                               "model.", param="model")

    def unembed(self, direction: Any) -> Any:
        """The unembedding of a direction needs the model's output weights, which the scripted engine lacks."""
        raise FieldNotHonoured("Reading a vector through the unembedding needs the model's output weights: it needs "
                               "a transformers model.", param="model")

    def embed(self, inputs: list[Any]) -> tuple[list[list[float]], int]:
        return [[float(len(x)), 1.0] for x in inputs], sum(len(x) for x in inputs)

    def steering_target(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True
