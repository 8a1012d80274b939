"""Answering batch lines exactly as the server answers the same requests.

Each line goes through the server's request builder, its steering resolution (``profile`` and
``steering_intensity`` against the SAEs attached as MILLM_HOME persists them), the engine's own calls, and
the server's renderers (``millm.render``). Only two things differ, both
written down: generation rows share the engine's batch (``millm.batch.generate``), and ids and
``created`` are fixed by the job (``millm.batch.lines``) rather than drawn per request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from millm.batch.generate import Job, run_generations
from millm.batch.lines import Answer, BatchLine
from millm.config import Settings
from millm.engine.base import Engine
from millm.engine.decode.driver import BatchSettings
from millm.engine.events import steered_label
from millm.errors import InvalidParameter, MillmError
from millm.probes.serving import loaded as loaded_probes
from millm.probes.serving import with_probes
from millm.registry import ModelEntry, resolve
from millm.render.bodies import embeddings_body, score_body, whole_body
from millm.render.headers import miLLM_headers, prepared_headers, probes_headers
from millm.render.shapes import CompletionShape
from millm.requests.builder import Built, build_chat, build_completion, build_embedding
from millm.requests.generation import Prepared, prepare
from millm.requests.limits import Limits
from millm.steering.service import SteeringService

log = logging.getLogger(__name__)

BUILDERS: dict[str, Callable[..., Built]] = {"chat": build_chat, "completions": build_completion,
                                             "embeddings": build_embedding}
Engines = Callable[[ModelEntry], Engine]  # the loaded engine for a model, with its persisted steering restored


@dataclass
class _Generation:
    """A generation line decided and planned, waiting for its (possibly shared) decode."""

    line: BatchLine
    engine: Engine
    job: Job
    shape: CompletionShape
    built: Built
    prepared: Prepared


def error_answer(line: BatchLine, exc: Exception) -> Answer:
    """What the server's error handlers write: a domain error's own status and body, else a 500."""
    if not isinstance(exc, MillmError):
        log.exception("unhandled error answering line %d", line.index + 1, exc_info=exc)
        exc = MillmError(f"Internal error: {exc}")
    return Answer(line, exc.status, exc.body())


class Answerer:
    """Answers batch lines; ``created`` is the job's timestamp, written into every completion body."""

    def __init__(self, engines: Engines, steering: SteeringService, settings: Settings, created: int,
                 shares: bool = True) -> None:
        self.engines = engines
        self.steering = steering
        self.settings = settings
        self.created = created
        self.shares = shares  # generation rows share the engine (scheduler or padded runs); false: each alone
        self.batch = BatchSettings.of(settings)
        self._entries: dict[str, ModelEntry] = {}

    def entry(self, model: str) -> ModelEntry:
        """The registry entry a body names (a name, never a path, as over HTTP)."""
        if model not in self._entries:
            self._entries[model] = resolve(model, self.settings)
        return self._entries[model]

    def answer(self, lines: list[BatchLine]) -> list[Answer]:
        """Every line's answer, in the order given; generation lines decode together where they can."""
        answers: dict[int, Answer] = {}
        waiting: list[_Generation] = []
        for line in lines:
            if line.refusal is not None:
                answers[line.index] = Answer(line, line.refusal["status"], line.refusal["body"])
                continue
            try:
                started = self._start(line)
            except Exception as exc:
                answers[line.index] = error_answer(line, exc)
                continue
            if isinstance(started, Answer):
                answers[line.index] = started
            else:
                waiting.append(started)
        by_engine: dict[int, list[_Generation]] = {}
        for gen in waiting:
            by_engine.setdefault(id(gen.engine), []).append(gen)
        for gens in by_engine.values():
            run_generations(gens[0].engine, [g.job for g in gens], self.batch, self.shares)
        for gen in waiting:
            answers[gen.line.index] = self._finish(gen)
        return [answers[line.index] for line in lines]

    def _shape(self, line: BatchLine, built: Built, engine: Engine) -> CompletionShape:
        shape = CompletionShape.of(built, engine.fingerprint, self.steering.store.label_map)
        shape.id = ("chatcmpl-" if shape.chat else "cmpl-") + line.digest
        shape.created = self.created
        return shape

    def _start(self, line: BatchLine) -> Answer | _Generation:
        """Build the request; embeddings and scoring are answered now, generation is planned."""
        entries: list[ModelEntry] = []

        def engine_of(name: str) -> str:
            entries.append(self.entry(name))
            return entries[-1].engine

        built = BUILDERS[line.route](line.body, engine_of)
        if built.stream:
            raise InvalidParameter("'stream' cannot be answered in a batch: each line gets one whole response; "
                                   "send stream: false.", param="stream")
        entry = entries[-1]
        if line.route == "embeddings":
            engine = self.engines(entry)
            vectors, tokens = engine.embed(built.embed_inputs)
            return Answer(line, 200, embeddings_body(built, vectors, tokens), miLLM_headers(built))
        if built.score is not None:
            engine = self.engines(entry)
            body = score_body(self._shape(line, built, engine), engine, built, engine.score(built.score))
            return Answer(line, 200, body, miLLM_headers(built))
        if built.profile is not None:
            self.steering.profile(built.profile)  # 404 before any load, as the server
        engine = self.engines(entry)
        probes = loaded_probes(self.settings.home, built.probes)  # the attached ones too, as the server's
        prepared = prepare(engine, with_probes(engine, built, self.steering, probes), Limits.of(self.settings),
                           self.steering)
        return _Generation(line, engine, Job(prepared.plans, check=prepared.check),
                           self._shape(line, built, engine), built, prepared)

    def _finish(self, gen: _Generation) -> Answer:
        if gen.job.error is not None:
            return error_answer(gen.line, gen.job.error)
        try:
            body: dict[str, Any] = whole_body(gen.shape, gen.job.events)
        except Exception as exc:
            return error_answer(gen.line, exc)
        return Answer(gen.line, 200, body, {**prepared_headers(gen.prepared, gen.built, steered_label(gen.job.events)),
                                            **probes_headers(gen.job.events)})
