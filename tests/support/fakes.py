"""A scripted engine behind the engine interface: the wire contract tested in milliseconds, no torch.

Its tokens are characters of a fixed vocabulary; it answers every prompt with the same scripted
text, decoding one character per step through the real per-row ``emit`` rule, so stops, hold-back,
lengths and cancellation behave exactly as on a real engine. It keeps every request it prepared
(``requests``) and scored (``scored``), so a test sees what a front end asked of it.

``steerable=True`` gives it steering the way llama.cpp has it: the real ``SteeringCore`` rules without hooks
(``ControlVectorSteering``, ``LAYERS`` layers of width ``WIDTH``, the bundled model's shape, so the bundled SAEs
attach). A generation whose row its steering would steer answers ``steered_script(norm)`` instead (the norm of
the row's control vector in the text, so different steering answers differently); a scoring read-out
(``return_sae_activations``) encodes a residual made from each token id through the attached SAE.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from millm.engine.base import (
    Capabilities,
    NoModelInternals,
    StepControl,
    check_scoring_supported,
    check_supported,
    fingerprint,
)
from millm.engine.decode.output import ChoiceOutput
from millm.engine.decode.rows import Row, emit
from millm.engine.events import Event, Usage
from millm.engine.params import ChatPrompt, GenerationRequest, Prompt, TokenPrompt, prompt_names
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
LAYERS, WIDTH = 30, 576  # SmolLM2-135M's: the bundled SAEs attach to a steerable fake


def steered_script(norm: float) -> str:
    """What a steered generation answers: the norm of its row's control vector, then the script."""
    return f"Steered {norm:.4g}. {SCRIPT}"


class CharDecoder:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(VOCAB[i] for i in ids if i != 0)


class FakeEngine(NoModelInternals):
    """Answers SCRIPT (then EOS) to everything; ``gate`` holds each step until set; ``steps`` counts them."""

    def __init__(self, model_id: str = "fake", engine_name: str = "transformers", script: str = SCRIPT,
                 context_window: int = 4096, steerable: bool = False, pace: float = 0.0) -> None:
        self.engine_name = engine_name
        self.capabilities = FULL if engine_name == "transformers" else GGUF
        if steerable:
            self.capabilities = replace(self.capabilities, steers=True, reads=True)
        self.steerable = steerable
        self._target: Any = None  # its SteeringTarget, made when first asked for (torch is imported then)
        self.pace = pace  # seconds each decode step and each scored row take
        self.requests: list[GenerationRequest] = []  # every request prepared, in order
        self.scored: list[ScoreRequest] = []  # every scoring request, in order
        self.entry = ModelEntry(id=model_id, engine=engine_name, source="path", path=Path(__file__))
        self.context_window = context_window
        self.weights = "dtype"
        self.max_token_bytes = max(len(t.encode()) for t in VOCAB)
        self.script = [VOCAB.index(ch) for ch in script] + [0]
        self.gate = threading.Event()
        self.gate.set()
        self.steps = 0
        self.pause_after: int | None = None  # clear ``gate`` once this many steps have run
        self.fail_at: tuple[int, Exception] | None = None  # raise this exception at that step
        self.started = threading.Event()
        self.closed = False

    def say(self, script: str) -> None:
        """Answer ``script`` (then EOS) from now on."""
        self.script = [VOCAB.index(ch) for ch in script] + [0]

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
        self.requests.append(request)
        return Plan(ids, request.params, budget, steering=request.steering, constraint=request.constraint,
                    scope=request.scope)

    def generate(self, request: GenerationRequest, control: StepControl | None = None) -> Iterator[Event]:
        return self.run(self.prepare(request), control)

    def run_all(self, plans: list[Plan], control: StepControl | None = None) -> Iterator[Event]:
        return run_each(self.run, plans, control)

    def _script_for(self, plan: Plan) -> list[int]:
        """The script, or ``steered_script`` when the plan's row would be steered (its control vector)."""
        target = self.steering_target()
        if target is None:
            return self.script
        from millm.steering.cvec import ROW

        steering = target.steering
        steering.bind_row(ROW, plan.steering, plan.scope)
        try:
            vector = steering.vector(ROW)
        finally:
            steering.release_row(ROW)
        if vector is None:
            return self.script
        import numpy as np

        return [VOCAB.index(ch) for ch in steered_script(float(np.linalg.norm(vector.data)))] + [0]

    def run(self, plan: Plan, control: StepControl | None = None) -> Iterator[Event]:
        self.started.set()
        script = self._script_for(plan)
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
            if self.pace:
                time.sleep(self.pace)
            for row in rows:
                if not row.done:
                    yield from emit(row, script[min(step, len(script) - 1)])
            if all(row.done for row in rows):
                break
        yield Usage(sum(len(ids) for ids in plan.prompt_ids), sum(r.output.tokens for r in rows))

    def score(self, request: ScoreRequest) -> list[ScoreResult]:
        check_scoring_supported(request, self.capabilities, self.engine_name)
        self.scored.append(request)
        results = []
        for row in request.rows:
            check_in_vocab(row.params, self.vocab_size)
            ids = self.tokenize(row.prompt)
            if not ids:
                raise InvalidScoringRequest(f"'{row.where}' tokenises to nothing.", param=row.where)
            allowed = row.params.allowed or tuple(range(1, 4))
            top = [TokenScore(t, -float(i + 1)) for i, t in enumerate(allowed)]
            results.append(ScoreResult(top[0], top, len(ids), prompt_ids=tuple(ids)))
            if self.pace:
                time.sleep(self.pace)
        if request.readout is not None and results:
            results[0] = replace(results[0], readout=self._readout(request, list(results[0].prompt_ids)))
        return results

    def _readout(self, request: ScoreRequest, ids: list[int]) -> dict[str, Any]:
        """The read-out of an unsteered pass: token ``t``'s residual is a fixed random vector seeded by ``t``,
        encoded by the attached SAE through the engine's own ``ReadoutRecorder``."""
        import torch

        from millm.steering.readout import UNSTEERED, ReadoutRecorder, bind_readout

        target = self.steering_target()
        if target is None:
            raise FieldNotHonoured("'return_sae_activations' needs a steerable engine.", param="return_sae_activations")
        assert request.readout is not None
        spec = replace(bind_readout(request.readout, target.steering, rows=len(request.rows),
                                    prompt_tokens=len(ids), max_tokens=0), read_point=UNSTEERED)
        recorder = ReadoutRecorder(spec, target.steering, lambda token_ids: [VOCAB[t] for t in token_ids])
        hidden = torch.stack([torch.randn(WIDTH, generator=torch.Generator().manual_seed(t)) for t in ids])
        recorder(hidden.unsqueeze(0) * 4)
        return recorder.result(ids, len(ids))

    def embed(self, inputs: list[Any]) -> tuple[list[list[float]], int]:
        return [[float(len(x)), 1.0] for x in inputs], sum(len(x) for x in inputs)

    @property
    def steering(self) -> Any:
        """The steering of a steerable fake (as ``TransformersEngine.steering``)."""
        target = self.steering_target()
        assert target is not None, "this FakeEngine was made without steerable=True"
        return target.steering

    def steering_target(self) -> Any:
        """None, or (``steerable``) llama.cpp-style steering over ``LAYERS`` layers of width ``WIDTH``."""
        if not self.steerable:
            return None
        if self._target is None:
            from millm.steering.target import ControlVectorSteering, Monitor, SteeringTarget

            self._target = SteeringTarget(self.model_id, ControlVectorSteering(LAYERS, WIDTH), Monitor(), reads=True)
        return self._target

    def close(self) -> None:
        self.closed = True
