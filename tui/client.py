"""What the TUI's screens know of miLLM: one small async client interface, and the values it returns.

Two implementations: ``tui.local.LocalClient`` drives an engine in this process through the same
``SteeringService`` and ``EngineWorker`` the server uses (steering changes run as engine commands
between decode steps), and ``tui.remote.RemoteClient`` drives a running ``millm serve`` through
``/v1`` and ``/api``. Both build chat requests with ``millm.requests.builder.build_chat``, so a value the
server would refuse is refused here with the same message. Errors are ``MillmError``s.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote

from millm.sae.cards import FeatureCard
from millm.steering.rung import rung_language

if TYPE_CHECKING:
    from millm.research.sweep import SweepResult

READOUT_TOP_K = 5
"""Features kept per generated token for the activation strip."""
SWEEP_STRENGTHS, SWEEP_PROMPTS, SWEEP_TOKENS = (0.0, 20.0, 40.0, 60.0, 80.0), 4, 24
"""The TUI's short sweep (``s`` on the strength slider); ``millm steer sweep`` measures at length."""


@dataclass(frozen=True)
class ModelInfo:
    """The model the client talks to, and how."""

    model_id: str
    engine: str  # "transformers" or "llama.cpp"
    steerable: bool
    where: str  # "in-process" or the server's URL


@dataclass(frozen=True)
class SAEInfo:
    """A registered SAE (or vector set: its features are its vectors) and, when attached to the model, its
    layer."""

    id: str
    name: str
    d_sae: int
    layer_hint: int | None
    attached_layer: int | None
    vectors: bool = False  # a vector set learned from examples, not an SAE

    @classmethod
    def of(cls, view: dict[str, Any]) -> SAEInfo:
        """From the SAE object ``/api/saes`` lists (and the local client builds alike)."""
        return cls(view["id"], view["name"], int(view["d_sae"]), view.get("layer_hint"), view.get("attached_layer"),
                   view.get("format") == "vectors")


@dataclass(frozen=True)
class Feature:
    """A feature of one SAE and its label (empty when it has none)."""

    sae_id: str
    index: int
    label: str = ""


@dataclass(frozen=True)
class SteeringState:
    """The operator's steering: on/off, the active profile, and values per attached SAE."""

    enabled: bool = True
    active_profile: str | None = None
    values: dict[str, dict[int, float]] = field(default_factory=dict)
    layers: dict[str, int] = field(default_factory=dict)
    live: bool = True  # False while a request runs with its own steering (operator wins afterwards)

    @classmethod
    def from_snapshot(cls, snap: dict[str, Any], live: bool = True) -> SteeringState:
        """From the GET /api/steering body (``Steering.snapshot()``)."""
        saes = snap.get("saes", {})
        return cls(bool(snap.get("enabled", True)), snap.get("active_profile"),
                   {sae: {int(f): float(s) for f, s in body["values"].items()} for sae, body in saes.items()},
                   {sae: int(body["layer"]) for sae, body in saes.items()}, live)


@dataclass(frozen=True)
class ProfileInfo:
    """A saved profile (plain, or backed by a cluster or circuit)."""

    name: str
    description: str
    model: str | None
    entries: int


@dataclass(frozen=True)
class TokenFeatures:
    """One generated token and the SAE features most active on it."""

    position: int
    token_id: int
    text: str
    features: list[tuple[int, float]]


@dataclass
class ChatResult:
    """What one answer ended with: its text, why it stopped, and what the response said about steering."""

    text: str = ""
    finish: str = "stop"  # "stop", "length" or "cancelled"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    steering: str = "none"  # X-miLLM-Steering: none, live or a profile's name
    intensity: str | None = None  # X-miLLM-Steering-Intensity: the λ the dial resolved to
    rung: str | None = None  # the circuit's evidence phrase, while a circuit steers this answer
    readout_sae: str | None = None
    tokens: list[TokenFeatures] = field(default_factory=list)


@dataclass(frozen=True)
class Piece:
    """Newly generated text of the answer."""

    text: str


@dataclass(frozen=True)
class Done:
    """The answer is complete (or was cancelled); always the last event."""

    result: ChatResult


ChatEvent = Piece | Done


class Client(Protocol):
    """Everything the screens do to miLLM. Every method may raise ``MillmError``."""

    async def info(self) -> ModelInfo: ...

    async def saes(self) -> list[SAEInfo]: ...

    async def attach(self, sae_id: str, layer: int | None = None) -> None: ...

    async def detach(self, sae_id: str) -> None: ...

    async def search(self, sae_id: str, query: str) -> list[Feature]: ...

    async def labels(self, sae_id: str) -> dict[int, str]: ...

    async def feature(self, sae_id: str, index: int) -> FeatureCard: ...

    async def resolve_steer(self, sae_id: str, items: list[str]) -> tuple[dict[int, float], list[str]]:
        """``FEATURE[=STRENGTH]`` items on the SAE resolved by ``--steer``'s one rule
        (``LabelIndex.resolve_assignments``): ``{index: strength}``, a feature alone at its recommended strength, and
        the lines saying which recommended strengths were taken; its refusal where an item resolves to none."""
        ...

    async def sweep(self, sae_id: str, index: int) -> SweepResult: ...

    async def steering(self) -> SteeringState: ...

    async def set_strength(self, sae_id: str, feature: int, strength: float) -> SteeringState: ...

    async def clear(self) -> SteeringState: ...

    async def set_enabled(self, enabled: bool) -> SteeringState: ...

    async def profiles(self) -> tuple[list[ProfileInfo], str | None]: ...

    async def save_profile(self, name: str, description: str = "") -> None: ...

    async def activate(self, name: str) -> SteeringState: ...

    async def export(self, name: str) -> dict[str, Any]: ...

    async def watch(self, sae_id: str, features: list[int]) -> None: ...

    async def monitor_history(self) -> list[dict[str, Any]]: ...

    async def active_circuit(self) -> str | None: ...

    def chat(self, body: dict[str, Any]) -> AsyncIterator[ChatEvent]: ...

    async def close(self) -> None: ...


def readout_ask(sae_id: str) -> dict[str, Any]:
    """The ``return_sae_activations`` the TUI sends: the top features of every generated token."""
    return {"sae_id": sae_id, "positions": "completion", "top_k": READOUT_TOP_K}


def readout_tokens(body: dict[str, Any], prompt_tokens: int,
                   text_of: Callable[[int, int], str]) -> list[TokenFeatures]:
    """The strip's tokens from a read-out body; ``text_of(k, token_id)`` is the k-th generated token's text."""
    out = []
    for pos in body.get("positions", []):
        position, token_id = int(pos["position"]), int(pos["token_id"])
        out.append(TokenFeatures(position, token_id, text_of(position - prompt_tokens, token_id),
                                 [(int(f["index"]), float(f["value"])) for f in pos["features"]]))
    return out


def rung_phrase(header: str | None) -> str | None:
    """The phrase of an X-miLLM-Circuit-Rung header (``2; language="..."``): the quoted language when
    present, else the ladder's phrase for the rung."""
    if not header:
        return None
    level, _, params = header.partition(";")
    _, found, quoted = params.partition("language=")
    if found and quoted.strip().startswith('"'):
        text = quoted.strip()[1:]
        out, escaped = [], False
        for ch in text:
            if escaped:
                out.append(ch)
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                break
            else:
                out.append(ch)
        return unquote("".join(out))
    try:
        return rung_language(int(level.strip()))
    except ValueError:
        return None
