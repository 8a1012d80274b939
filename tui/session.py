"""One TUI chat session: its history, its sampling settings, and the request bodies they make. Pure.

A body here is exactly what ``/v1/chat/completions`` takes; both clients check it with
``millm.requests.builder.build_chat`` before any model work, so the TUI refuses what the server refuses.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from millm.requests.validation import SEED_MAX
from millm.steering.intensity import Dial, Symbol
from tui.client import readout_ask
from tui.controls import wire_dial

SAMPLING_FIELDS = ("temperature", "max_tokens", "seed")


def parse_field(text: str) -> int | float | str | None:
    """A form field as the request carries it: empty is absent, a number is a number, anything else is
    sent as typed so the builder refuses it naming the field."""
    text = text.strip()
    if not text:
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def sampling_fields(form: dict[str, str]) -> dict[str, Any]:
    """The sampling form's fields (temperature, max tokens, seed) that are set."""
    parsed = {name: parse_field(form.get(name, "")) for name in SAMPLING_FIELDS}
    return {k: v for k, v in parsed.items() if v is not None}


@dataclass
class SteeringFields:
    """The steering fields of the chat bodies the TUI sends: the dial (``steering_intensity``), a profile loaded for
    this session's chats (``profile``), and the SAE to read (``return_sae_activations``); the server resolves them
    to the request's steering."""

    dial: Dial = None
    profile: str | None = None
    readout_sae: str | None = None


def chat_body(model: str, messages: list[dict[str, Any]], sampling: dict[str, Any],
              steering: SteeringFields) -> dict[str, Any]:
    """The streamed chat completion body for ``messages`` under these settings."""
    body: dict[str, Any] = {"model": model, "messages": messages, "stream": True, **sampling}
    if steering.dial is not None:
        body["steering_intensity"] = wire_dial(steering.dial)
    if steering.profile is not None:
        body["profile"] = steering.profile
    if steering.readout_sae is not None:
        body["return_sae_activations"] = readout_ask(steering.readout_sae)
    return body


def compare_bodies(body: dict[str, Any], rng: random.Random | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The same request unsteered (``steering_intensity: "off"``, which turns steering off whatever the
    base) and as the dial has it, with one seed: the body's, else a fresh one for both."""
    seed = body.get("seed")
    if seed is None:
        seed = (rng or random.Random()).randrange(SEED_MAX + 1)
    steered = {**body, "seed": seed}
    return {**steered, "steering_intensity": Symbol.OFF.value}, steered


@dataclass
class Conversation:
    """The history of one chat, kept until /reset; an optional system prompt heads it."""

    system: str | None = None
    turns: list[dict[str, Any]] = field(default_factory=list)

    def messages(self, prompt: str | None = None) -> list[dict[str, Any]]:
        """The conversation so far, plus ``prompt`` as the next user turn."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        tail = [{"role": "user", "content": prompt}] if prompt is not None else []
        return head + self.turns + tail

    def add(self, prompt: str, answer: str) -> None:
        """Keep a finished exchange."""
        self.turns += [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]

    def reset(self) -> None:
        self.turns = []
