"""A scripted client: the TUI's client interface over fixed data, for snapshots and pure UI tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from millm.errors import InvalidParameter, SAENotAttached
from millm.requests.builder import build_chat
from millm.sae.cards import Example, FeatureCard
from tui.client import (
    ChatEvent,
    ChatResult,
    Done,
    Feature,
    ModelInfo,
    Piece,
    ProfileInfo,
    SAEInfo,
    SteeringState,
    TokenFeatures,
)

SAE = "smollm2-135m-res-L10"
LABELS = {12: "rain, storm, weather", 40: "ocean, sea, waves", 77: "happy, joy, smile", 301: "storm, thunder",
          512: "code, python"}
PLAIN = ["The", " sky", " is", " clear", " today", "."]
STEERED = ["Rain", " and", " storms", " roll", " in", "."]


class ScriptedClient:
    """Answers, labels and state from fixed tables; records every body it is sent."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.values: dict[str, dict[int, float]] = {SAE: {12: 40.0}}
        self.enabled = True
        self.active: str | None = None
        self.saved: dict[str, dict[str, Any]] = {"calm": {"name": "calm", "description": "calmer answers",
                                                          "model": "SmolLM2-135M-Instruct",
                                                          "entries": [{"sae": SAE, "feature": 77, "strength": 30.0}]}}
        self.bodies: list[dict[str, Any]] = []
        self.watched: list[int] = []
        self.cards_asked: list[tuple[str, int]] = []

    async def info(self) -> ModelInfo:
        return ModelInfo("SmolLM2-135M-Instruct", "transformers", True, "in-process")

    async def saes(self) -> list[SAEInfo]:
        return [SAEInfo(SAE, SAE, 4608, 10, 10), SAEInfo("sae_0123456789ab", "my-sae", 1024, 6, None)]

    async def attach(self, sae_id: str, layer: int | None = None) -> None:
        raise InvalidParameter("Layer 6 already has an SAE attached; detach it first.", param="layer")

    async def detach(self, sae_id: str) -> None:
        self.values.pop(sae_id, None)

    async def search(self, sae_id: str, query: str) -> list[Feature]:
        return [Feature(sae_id, i, label) for i, label in LABELS.items() if query.lower() in label] if sae_id == SAE \
            else []

    async def labels(self, sae_id: str) -> dict[int, str]:
        return dict(LABELS) if sae_id == SAE else {}

    async def resolve_steer(self, sae_id: str, items: list[str]) -> tuple[dict[int, float], list[str]]:
        """By the one rule, on the labels with the held-out measure of each feature whose card has one."""
        from millm.sae.labels import LabelIndex  # imports torch: not at the fast tier's collection

        labels = await self.labels(sae_id)
        cards = [await self.feature(sae_id, index) for index in labels]
        said: list[str] = []
        index = LabelIndex(labels, sae_id, {c.index: c.held_out for c in cards if c.held_out is not None})
        return index.resolve_assignments(items, "steer", said.append), said

    async def feature(self, sae_id: str, index: int) -> FeatureCard:
        self.cards_asked.append((sae_id, index))
        if sae_id != SAE:
            return FeatureCard(sae_id, index, 1024, note="my-sae has no features.jsonl")
        return FeatureCard(sae_id, index, 4608, LABELS.get(index, ""), True, 0.0125, 12.5, [("rain", 40.0)],
                           [Example("the« rain» fell", 12.5)], [" storm", " wet"])

    async def steering(self) -> SteeringState:
        return SteeringState(self.enabled, self.active, {k: dict(v) for k, v in self.values.items()}, {SAE: 10})

    async def set_strength(self, sae_id: str, feature: int, strength: float) -> SteeringState:
        if sae_id != SAE:
            raise SAENotAttached(f"SAE {sae_id} is not attached to the loaded model.", param="sae")
        if strength == 0:
            self.values[sae_id].pop(feature, None)
        else:
            self.values[sae_id][feature] = strength
        self.active = None
        return await self.steering()

    async def clear(self) -> SteeringState:
        self.values = {SAE: {}}
        return await self.steering()

    async def set_enabled(self, enabled: bool) -> SteeringState:
        self.enabled = enabled
        return await self.steering()

    async def profiles(self) -> tuple[list[ProfileInfo], str | None]:
        return [ProfileInfo(p["name"], p["description"], p["model"], len(p["entries"]))
                for p in self.saved.values()], self.active

    async def save_profile(self, name: str, description: str = "") -> None:
        entries = [{"sae": SAE, "feature": f, "strength": s} for f, s in self.values[SAE].items()]
        self.saved[name] = {"name": name, "description": description, "model": "SmolLM2-135M-Instruct",
                            "entries": entries}

    async def activate(self, name: str) -> SteeringState:
        self.values = {SAE: {e["feature"]: e["strength"] for e in self.saved[name]["entries"]}}
        self.active = name
        return await self.steering()

    async def export(self, name: str) -> dict[str, Any]:
        return self.saved[name]

    async def watch(self, sae_id: str, features: list[int]) -> None:
        self.watched = features

    async def monitor_history(self) -> list[dict[str, Any]]:
        return [{"features": {str(f): {"mean": (k * 7 + f) % 5 / 2, "max": 3.0} for f in self.watched}}
                for k in range(12)]

    async def active_circuit(self) -> str | None:
        return None

    def steered(self, body: dict[str, Any]) -> bool:
        return self.enabled and body.get("steering_intensity") != "off" and any(self.values[SAE].values())

    async def chat(self, body: dict[str, Any]) -> AsyncIterator[ChatEvent]:
        build_chat(body, lambda _: "transformers")  # refused as both real clients refuse it
        self.bodies.append(body)
        words = STEERED if self.steered(body) else PLAIN
        for word in words:
            if self.delay:
                await asyncio.sleep(self.delay)
            yield Piece(word)
        dial = body.get("steering_intensity")
        tokens = [TokenFeatures(30 + k, 1000 + k, w, [(12, 4.0 - k * 0.5), (40, 1.5), (77, 0.25)])
                  for k, w in enumerate(words)]
        yield Done(ChatResult("".join(words), "stop", 30, len(words), "live" if self.steered(body) else "none",
                              None if dial is None else ("0.0" if dial == "off" else str(dial)), None, SAE, tokens))

    async def close(self) -> None:
        return None
