"""The in-process client: the TUI drives an engine loaded in this process, exactly as the server does.

Model work and steering changes go through one ``EngineWorker`` (the server's): a generation streams
from the engine thread, and every steering change is a command that runs on that thread between two
decode steps, so no hook changes under a running forward pass, and a change made while an answer is
generated follows the operator-wins rule. Requests are built by ``millm.requests.builder.build_chat`` and
prepared by ``millm.requests.generation.prepare`` on the engine thread, as ``/v1/chat/completions`` builds and
prepares them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from millm import local
from millm.config import get_settings
from millm.engine.base import Engine
from millm.engine.events import Activations, Delta, Finish, Usage
from millm.engine.worker import EngineWorker
from millm.errors import InvalidParameter
from millm.requests.builder import build_chat
from millm.requests.generation import prepare
from millm.requests.limits import Limits
from millm.sae.cards import FeatureCard, read_card
from millm.steering.rung import rung_language
from millm.steering.target import SteeringTarget
from tui.client import (
    SWEEP_PROMPTS,
    SWEEP_STRENGTHS,
    SWEEP_TOKENS,
    ChatEvent,
    ChatResult,
    Done,
    Feature,
    ModelInfo,
    Piece,
    ProfileInfo,
    SAEInfo,
    SteeringState,
    readout_tokens,
)

if TYPE_CHECKING:
    from millm.research.sweep import SweepResult
    from millm.steering.service import SteeringService

class LocalClient:
    """miLLM in this process, on ``engine`` (steering persisted through ``service``)."""

    def __init__(self, engine: Engine, service: SteeringService | None = None) -> None:
        self.engine = engine
        self.service = service or local.steering_service()
        self.worker = EngineWorker(get_settings().max_queue)
        self._target = engine.steering_target()

    @classmethod
    async def open(cls, model: str | None) -> LocalClient:
        """Load ``model`` (default: the configured one) off the event loop, with its persisted steering."""
        return cls(await asyncio.to_thread(local.engine_for, model))

    def target(self) -> SteeringTarget:
        if self._target is None:
            raise InvalidParameter(f"'{self.engine.model_id}' runs on {self.engine.engine_name}, which cannot be "
                                   "steered.", param="model")
        return self._target

    async def info(self) -> ModelInfo:
        return ModelInfo(self.engine.model_id, self.engine.engine_name, self._target is not None, "in-process")

    # SAEs
    async def saes(self) -> list[SAEInfo]:
        views = [self.service.view(r, self._target) for r in await asyncio.to_thread(self.service.store.saes)]
        return [SAEInfo.of(v) for v in views]

    async def attach(self, sae_id: str, layer: int | None = None) -> None:
        await self.worker.command(self.service.attach, self.target(), sae_id, layer)

    async def detach(self, sae_id: str) -> None:
        await self.worker.command(self.service.detach, self.target(), sae_id)

    async def search(self, sae_id: str, query: str) -> list[Feature]:
        """As ``GET /api/saes/{id}/features?q=`` ranks them (``millm.sae.labels.rank``)."""
        index = await asyncio.to_thread(self.service.label_index, sae_id)
        rows = index.rows(query or None)
        return [Feature(sae_id, int(r["index"]), r["label"]) for r in rows]

    async def labels(self, sae_id: str) -> dict[int, str]:
        return await asyncio.to_thread(self.service.store.label_map, sae_id)

    async def resolve_steer(self, sae_id: str, items: list[str]) -> tuple[dict[int, float], list[str]]:
        """On the SAE's whole index, as ``millm chat --steer`` resolves (``SteeringService.label_index``)."""
        said: list[str] = []
        index = await asyncio.to_thread(self.service.label_index, sae_id)
        return index.resolve_assignments(items, "steer", said.append), said

    async def feature(self, sae_id: str, index: int) -> FeatureCard:
        record = self.service.sae(sae_id)
        label = self.service.store.label(sae_id, index)
        return await asyncio.to_thread(read_card, record["path"], index, int(record["d_sae"]), name=record["name"],
                                       labels={index: label} if label is not None else {})

    async def sweep(self, sae_id: str, index: int) -> SweepResult:
        """The TUI's short sweep of one feature (``SWEEP_*``), on the engine thread as one job: its answers are
        sampled by the engine's scheduler as requests are, and afterwards the attachments and values are as
        they were."""
        from millm.research.sweep import sweep_feature

        engine, service = self.engine, self.service
        self.target()
        label = service.store.label(sae_id, index) or ""
        return await self.worker.call(lambda: sweep_feature(
            service, engine, sae_id, index, label=label, strengths=SWEEP_STRENGTHS, prompts=SWEEP_PROMPTS,
            tokens=SWEEP_TOKENS))

    # live values
    async def steering(self) -> SteeringState:
        steering = self.target().steering
        return SteeringState.from_snapshot(steering.snapshot(), steering.live)

    async def set_strength(self, sae_id: str, feature: int, strength: float) -> SteeringState:
        target, service = self.target(), self.service
        await self.worker.command(lambda: service.set_values(target, sae_id, {feature: strength}, merge=True))
        return await self.steering()

    async def clear(self) -> SteeringState:
        await self.worker.command(self.service.clear, self.target())
        return await self.steering()

    async def set_enabled(self, enabled: bool) -> SteeringState:
        await self.worker.command(self.service.set_enabled, self.target(), enabled)
        return await self.steering()

    # profiles
    async def profiles(self) -> tuple[list[ProfileInfo], str | None]:
        rows = await asyncio.to_thread(self.service.store.profiles)
        active = self._target.steering.active_profile if self._target is not None else None
        return [ProfileInfo(p["name"], p["description"], p["model"], len(p["entries"])) for p in rows], active

    async def save_profile(self, name: str, description: str = "") -> None:
        await asyncio.to_thread(self.service.profile_from_current, self.target(), name, description)

    async def activate(self, name: str) -> SteeringState:
        await self.worker.command(self.service.activate, self.target(), name)
        return await self.steering()

    async def export(self, name: str) -> dict[str, Any]:
        return await asyncio.to_thread(self.service.export, name)

    # monitoring and circuits
    async def watch(self, sae_id: str, features: list[int]) -> None:
        config = {"enabled": bool(features), "sae": sae_id, "features": features}
        await self.worker.command(self.service.configure_monitor, self.target(), config)

    async def monitor_history(self) -> list[dict[str, Any]]:
        return list(self.target().monitor.history) if self._target is not None else []

    async def active_circuit(self) -> str | None:
        return self.service.active_circuit(self._target, self.engine.model_id)

    # generation
    async def chat(self, body: dict[str, Any]) -> AsyncIterator[ChatEvent]:
        """Stream one chat answer; closing the iterator (or cancelling its task) stops it at the next step.
        Built off the event loop, prepared on the engine thread, as ``/v1/chat/completions`` does."""
        engine = self.engine
        built = await asyncio.to_thread(build_chat, body, lambda _: engine.engine_name)
        prepared = await self.worker.call(prepare, engine, built, Limits.of(get_settings()), self.service)
        steering = prepared.steering
        result = ChatResult(steering=prepared.label, intensity=steering.echo,
                            rung=rung_language(steering.rung) if steering.rung is not None else None)
        events = await self.worker.generate(engine, prepared.plans, prepared.check)
        readout: dict[str, Any] | None = None
        async for event in events:
            if isinstance(event, Delta):
                result.text += event.text
                yield Piece(event.text)
            elif isinstance(event, Finish):
                result.finish, result.completion_tokens = event.reason, event.completion_tokens
            elif isinstance(event, Activations):
                readout = event.body
            elif isinstance(event, Usage):
                result.prompt_tokens = event.prompt_tokens
        if readout is not None:
            result.readout_sae = readout["sae_id"]
            result.tokens = readout_tokens(readout, result.prompt_tokens, lambda _, tid: engine.token_text(tid))
        yield Done(result)

    async def close(self) -> None:
        self.worker.shutdown()
