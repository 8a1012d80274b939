"""The engine interface every front end uses: what an engine can do, and how it is asked.

Front ends (server, CLI, TUI) hold an ``Engine`` and call only what this Protocol declares. An
engine refuses what it cannot do (``Capabilities`` says so up front, and ``prepare``/``score``
raise when asked anyway), so a front end that bypasses the field table still cannot get a silently
dropped constraint, steering or read-out.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from millm.engine.events import Event
from millm.engine.params import Forced, GenerationRequest, Prompt
from millm.engine.plan import Plan
from millm.errors import FieldNotHonoured

if TYPE_CHECKING:
    import torch

    from millm.engine.scoring import ScoreRequest, ScoreResult
    from millm.registry import ModelEntry
    from millm.steering.target import SteeringTarget


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do: the one record the field table's engine columns, the steering service and the
    research code are checked against."""

    steers: bool  # a request's own steering and the live values (SAE hooks, or llama.cpp's control vectors)
    reads: bool  # the residual can be read: monitoring, return_sae_activations, teacher-forced research reads
    scores: bool  # next-token log-probabilities (scoring mode, echo)
    seedable: bool  # seeded sampling that repeats byte for byte
    constrainable: bool  # response_format enforced token by token
    multiple_choices: bool  # n > 1 in one request
    batchable: bool = False  # continuous batching (a ``batch_scheduler``)


@dataclass(eq=False)
class StepControl:
    """What the decode loop checks between steps: cancellation, and commands to run on this thread.

    Steering and monitoring changes are queued as commands and run here, between two forward
    passes, so a hook never changes under a forward pass that is reading it.
    """

    cancel: threading.Event = field(default_factory=threading.Event)
    run_commands: Callable[[], None] = lambda: None
    reason: Exception | None = None  # why the server cancelled (an unload), told to the consumer

    def stop(self, reason: Exception) -> None:
        """Cancel for the server's own reason; the consumer gets ``reason`` as its error."""
        self.reason = reason
        self.cancel.set()

    def checking(self, check: Callable[[], None]) -> StepControl:
        """This control, also running ``check`` after the commands of every step boundary: an operator change
        that invalidates a request's steering ends it there, with the check's error."""
        def run_commands() -> None:
            self.run_commands()
            check()

        return replace(self, run_commands=run_commands)

    def between_steps(self) -> bool:
        """Run pending commands; True when the consumer has gone and decoding should stop."""
        self.run_commands()
        return self.cancel.is_set()


class Engine(Protocol):
    """A loaded model behind miLLM's engine interface."""

    engine_name: str
    entry: ModelEntry
    capabilities: Capabilities
    context_window: int
    weights: str  # how its linear weights are kept: "dtype" (its dtype, or a GGUF file's own) or "int8"
    max_token_bytes: int  # the most bytes one token holds: bounds the characters a window can take

    @property
    def model_id(self) -> str: ...

    @property
    def fingerprint(self) -> str: ...

    @property
    def vocab_size(self) -> int: ...

    def tokenize(self, prompt: Prompt) -> list[int]: ...

    def token_text(self, token_id: int) -> str: ...

    def prepare(self, request: GenerationRequest) -> Plan: ...

    def run(self, plan: Plan, control: StepControl | None = None) -> Iterator[Event]: ...

    def run_all(self, plans: list[Plan], control: StepControl | None = None) -> Iterator[Event]: ...

    def generate(self, request: GenerationRequest, control: StepControl | None = None) -> Iterator[Event]: ...

    def score(self, request: ScoreRequest) -> list[ScoreResult]: ...

    def forced(self, reads: list[Forced], batch_size: int = 16) -> list[list[float]]: ...

    def residuals(self, reads: list[Forced], layer: int, position: str = "mean",
                  batch_size: int = 16) -> torch.Tensor: ...

    def unembed(self, direction: torch.Tensor) -> torch.Tensor: ...

    def embed(self, inputs: list[Any]) -> tuple[list[list[float]], int]: ...

    def steering_target(self) -> SteeringTarget | None: ...

    def close(self) -> None: ...


def fingerprint(model: str, revision: str | None, dtype: str | None, quantization: str | None, engine: str) -> str:
    """``millm:<model>@<revision>:<dtype>/<quantization>:<engine>``; a part not known says unrecorded."""
    def part(value: str | None) -> str:
        return value or "unrecorded"

    return f"millm:{model}@{part(revision)}:{part(dtype)}/{part(quantization)}:{engine}"


def numerics(engine: Engine) -> str:
    """The dtype part of ``engine``'s fingerprint (``float32``, ``float32+int8``, ``bfloat16``): the numbers its
    answers come from, which a steering strength measured on it depends on; empty where unrecorded."""
    dtype = engine.fingerprint.rsplit(":", 2)[1].split("/")[0]
    return "" if dtype == "unrecorded" else dtype


class NoModelInternals:
    """The refusals of an engine that exposes no residual stream or output weights (llama.cpp, the scripted
    engine): teacher-forced reads, residual reads and unembedding need a transformers model."""

    def forced(self, reads: list[Forced], batch_size: int = 16) -> list[list[float]]:
        raise FieldNotHonoured("Teacher-forced reads (the screen's estimate) need a transformers model.", param="model")

    def residuals(self, reads: list[Forced], layer: int, position: str = "mean", batch_size: int = 16) -> Any:
        raise FieldNotHonoured("Learning a steering vector reads the residual stream: it needs a transformers "
                               "model.", param="model")

    def unembed(self, direction: Any) -> Any:
        raise FieldNotHonoured("Reading a vector through the unembedding needs the model's output weights: it needs "
                               "a transformers model.", param="model")


def check_supported(request: GenerationRequest, caps: Capabilities, engine_name: str) -> None:
    """Refuse, naming the field, what a generation request asks of an engine that cannot do it."""

    asks = {
        "profile": request.steering is not None and request.steering.values is not None and not caps.steers,
        "steering_scope": request.scope != "all" and not caps.steers,
        "return_sae_activations": request.readout is not None and not caps.reads,
        "response_format": request.constraint is not None and not caps.constrainable,
        "seed": request.params.seed is not None and not caps.seedable,
        "n": request.params.n > 1 and not caps.multiple_choices,
    }
    for name, refused in asks.items():
        if refused:
            raise FieldNotHonoured(f"'{name}' cannot be honoured by the {engine_name} engine; it was refused "
                                   "rather than ignored.", param=name)


def check_scoring_supported(request: ScoreRequest, caps: Capabilities, engine_name: str) -> None:
    """Refuse, naming the field, what a scoring request asks of an engine that cannot do it."""

    if not caps.scores:
        raise FieldNotHonoured(f"Scoring needs the next-token distribution, which the {engine_name} engine does "
                               "not expose here; use a transformers model.", param="logprobs")
    if request.readout is not None and not caps.reads:
        raise FieldNotHonoured(f"'return_sae_activations' cannot be honoured by the {engine_name} engine: it reads no "
                               "residual.", param="return_sae_activations")
