"""The HTTP client: the TUI drives a running ``millm serve`` through ``/v1`` and ``/api``.

Keys come from the environment as the server reads them: ``MILLM_API_KEY`` for ``/v1`` and
``MILLM_ADMIN_KEY`` for management changes. Chat bodies are checked by ``millm.requests.builder.build_chat``
before they are sent, so a refusal reads the same as the server's. Cancelling an answer closes its
stream; the server stops generating at the next decode step.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx

from millm.config import get_settings
from millm.errors import InvalidParameter, MillmError
from millm.names import steering_label
from millm.requests.builder import build_chat
from millm.sae.cards import FeatureCard
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
    readout_tokens,
    rung_phrase,
)

if TYPE_CHECKING:
    from millm.research.sweep import SweepResult

INTENSITY_HEADER = "x-millm-steering-intensity"
RUNG_HEADER = "x-millm-circuit-rung"
STEERING_HEADER = "x-millm-steering"


class RemoteError(MillmError):
    """What the server answered with (its status, code and message), or why it could not be reached."""

    def __init__(self, message: str, status: int = 0, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.status = status
        self.code = code or "unreachable"


def _error(response: httpx.Response, body: bytes) -> RemoteError:
    try:
        err = json.loads(body)["error"]
        return RemoteError(err["message"], response.status_code, err.get("code"), err.get("param"))
    except (ValueError, KeyError, TypeError):
        return RemoteError(f"{response.request.method} {response.request.url.path}: HTTP {response.status_code}",
                           response.status_code)


def _q(part: str) -> str:
    return quote(part, safe="")


async def sse_chunks(lines: AsyncIterator[str]) -> AsyncGenerator[dict[str, Any], None]:
    """The JSON chunks of a streamed completion, up to ``[DONE]``; an ``error`` event raised as the server's
    error."""
    event_name = ""
    async for line in lines:
        if line.startswith("event:"):
            event_name = line[6:].strip()
            continue
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        chunk = json.loads(payload)
        if event_name == "error":
            err = chunk["error"]
            raise RemoteError(err["message"], 200, err.get("code"), err.get("param"))
        yield chunk


def chunk_texts(chunk: dict[str, Any], result: ChatResult) -> list[str]:
    """The texts a chunk's choices add, in order; its finish reason and usage go into ``result``."""
    texts = []
    for choice in chunk.get("choices", []):
        text = choice.get("delta", {}).get("content")
        if text:
            texts.append(text)
        if choice.get("finish_reason"):
            result.finish = choice["finish_reason"]
    if "usage" in chunk:
        result.prompt_tokens = chunk["usage"]["prompt_tokens"]
        result.completion_tokens = chunk["usage"]["completion_tokens"]
    return texts


def _read_headers(result: ChatResult, headers: httpx.Headers) -> None:
    """What steered the answer, as the response's miLLM headers say."""
    result.steering = steering_label(headers.get(STEERING_HEADER, "none"))
    result.intensity = headers.get(INTENSITY_HEADER)
    result.rung = rung_phrase(headers.get(RUNG_HEADER))


def _read_readout(result: ChatResult, readout: dict[str, Any], pieces: list[str]) -> None:
    """The answer's read-out, each token named by the piece it streamed as where pieces and tokens align."""
    result.readout_sae = readout["sae_id"]
    # without a stop string each generated token streams as its own piece, except a token that
    # ends inside a character (its text comes with the next) and the end-of-turn token
    aligned = len(pieces) >= result.completion_tokens - 1

    def text_of(k: int, token_id: int) -> str:
        return pieces[k] if aligned and 0 <= k < len(pieces) else f"#{token_id}"

    result.tokens = readout_tokens(readout, result.prompt_tokens, text_of)


class RemoteClient:
    """A ``millm serve`` at ``url``; ``model`` names the model to chat with when none is loaded."""

    def __init__(self, url: str, model: str | None = None, transport: httpx.AsyncBaseTransport | None = None) -> None:
        settings = get_settings()
        self.url = url.rstrip("/")
        self.model = model
        self._v1_headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        self._admin_headers = {"Authorization": f"Bearer {settings.admin_key}"} if settings.admin_key else {}
        self.http = httpx.AsyncClient(base_url=self.url, transport=transport,
                                      timeout=httpx.Timeout(30.0, read=None))
        self._info: ModelInfo | None = None

    @classmethod
    async def open(cls, url: str, model: str | None) -> RemoteClient:
        """Connect, and learn which model the server runs (a clear error when it cannot be reached)."""
        client = cls(url, model)
        await client.info()
        return client

    async def _call(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None) -> Any:
        headers = (self._admin_headers or self._v1_headers) if method != "GET" else self._v1_headers
        try:
            response = await self.http.request(method, path, json=body, params=params, headers=headers)
        except httpx.TransportError as exc:
            raise RemoteError(f"Cannot reach {self.url}: {exc}.") from None
        if response.status_code >= 400:
            raise _error(response, response.content)
        return response.json()

    async def info(self) -> ModelInfo:
        if self._info is None:
            found = await self._call("GET", "/api/health/inference")
            model = found.get("model") or self.model or get_settings().default_model
            engine = found.get("engine") or "transformers"
            self._info = ModelInfo(model, engine, engine == "transformers", self.url)
        return self._info

    # SAEs
    async def saes(self) -> list[SAEInfo]:
        return [SAEInfo.of(v) for v in (await self._call("GET", "/api/saes"))["data"]]

    async def attach(self, sae_id: str, layer: int | None = None) -> None:
        await self._call("POST", f"/api/saes/{_q(sae_id)}/attach", {} if layer is None else {"layer": layer})

    async def detach(self, sae_id: str) -> None:
        await self._call("POST", f"/api/saes/{_q(sae_id)}/detach")

    async def search(self, sae_id: str, query: str) -> list[Feature]:
        params = {"q": query} if query else None
        rows = (await self._call("GET", f"/api/saes/{_q(sae_id)}/features", params=params))["features"]
        return [Feature(sae_id, int(r["index"]), r["label"]) for r in rows]

    async def labels(self, sae_id: str) -> dict[int, str]:
        """The first labels the server lists; others come by index from :meth:`feature`."""
        rows = (await self._call("GET", f"/api/saes/{_q(sae_id)}/features"))["features"]
        return {int(r["index"]): r["label"] for r in rows}

    async def feature(self, sae_id: str, index: int) -> FeatureCard:
        return FeatureCard.from_json(await self._call("GET", f"/api/saes/{_q(sae_id)}/features/{index}"))

    async def resolve_steer(self, sae_id: str, items: list[str]) -> tuple[dict[int, float], list[str]]:
        """By the server, on the SAE's whole index (``POST /api/saes/{id}/resolve``): the rule and its refusals
        as ``millm chat --steer`` has them."""
        found = await self._call("POST", f"/api/saes/{_q(sae_id)}/resolve", {"steer": items})
        return {int(i): float(v) for i, v in found["values"].items()}, list(found["said"])

    async def sweep(self, sae_id: str, index: int) -> SweepResult:
        raise InvalidParameter("A sweep runs the model in this process: use `millm tui` without --url, or "
                               f"`millm steer sweep {index} --sae {sae_id}` where the server runs.", param="sweep")

    # live values
    async def steering(self) -> SteeringState:
        body = await self._call("GET", "/api/steering")
        return SteeringState.from_snapshot(body, bool(body.get("live", True)))

    async def set_strength(self, sae_id: str, feature: int, strength: float) -> SteeringState:
        body = await self._call("PATCH", "/api/steering", {"sae": sae_id, "values": {str(feature): strength}})
        return SteeringState.from_snapshot(body, bool(body.get("live", True)))

    async def clear(self) -> SteeringState:
        body = await self._call("DELETE", "/api/steering")
        return SteeringState.from_snapshot(body, bool(body.get("live", True)))

    async def set_enabled(self, enabled: bool) -> SteeringState:
        body = await self._call("POST", f"/api/steering/{'enable' if enabled else 'disable'}")
        return SteeringState.from_snapshot(body, bool(body.get("live", True)))

    # profiles
    async def profiles(self) -> tuple[list[ProfileInfo], str | None]:
        body = await self._call("GET", "/api/profiles")
        rows = [ProfileInfo(p["name"], p.get("description", ""), p.get("model"), len(p.get("entries", [])))
                for p in body["data"]]
        return rows, body.get("active")

    async def save_profile(self, name: str, description: str = "") -> None:
        await self._call("POST", "/api/profiles", {"name": name, "description": description, "from_current": True})

    async def activate(self, name: str) -> SteeringState:
        body = await self._call("POST", f"/api/profiles/{_q(name)}/activate")
        return SteeringState.from_snapshot(body, bool(body.get("live", True)))

    async def export(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = await self._call("GET", f"/api/profiles/{_q(name)}/export")
        return found

    # monitoring and circuits
    async def watch(self, sae_id: str, features: list[int]) -> None:
        await self._call("PUT", "/api/monitoring", {"enabled": bool(features), "sae": sae_id, "features": features})

    async def monitor_history(self) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = (await self._call("GET", "/api/monitoring/history"))["data"]
        return data

    async def active_circuit(self) -> str | None:
        try:
            found = await self._call("GET", "/api/circuits/active")
        except RemoteError as exc:
            if exc.status == 404:  # a server without circuits
                return None
            raise
        active = found.get("active")
        return str(active) if active is not None else None

    # generation
    async def chat(self, body: dict[str, Any]) -> AsyncIterator[ChatEvent]:
        """Stream one answer over SSE; leaving the loop (or cancelling its task) closes the stream."""
        engine = (await self.info()).engine
        build_chat(body, lambda _: engine)  # refused here as the server would refuse it
        result = ChatResult()
        pieces: list[str] = []
        readout: dict[str, Any] | None = None
        try:
            async with self.http.stream("POST", "/v1/chat/completions", json={**body, "stream": True},
                                        headers=self._v1_headers) as response:
                if response.status_code >= 400:
                    raise _error(response, await response.aread())
                _read_headers(result, response.headers)
                async with aclosing(sse_chunks(response.aiter_lines())) as chunks:
                    async for chunk in chunks:
                        if "millm" in chunk:
                            readout = chunk["millm"].get("sae_activations")
                        for text in chunk_texts(chunk, result):
                            pieces.append(text)
                            result.text += text
                            yield Piece(text)
        except httpx.TransportError as exc:
            raise RemoteError(f"Cannot reach {self.url}: {exc}.") from None
        if readout is not None:
            _read_readout(result, readout, pieces)
        yield Done(result)

    async def close(self) -> None:
        await self.http.aclose()
