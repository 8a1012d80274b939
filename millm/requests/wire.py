"""Wire shapes of the /v1 requests (pydantic, strict types). Ranges live in ``millm.requests.validation``.

Unknown fields are allowed here: the field table (``millm.requests.fields``) decides whether each is used,
refused or reported.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from millm.errors import InvalidParameter


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class _Sampling(_Wire):
    model: str = Field(description="A model id from /v1/models")
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    temperature: float | None = Field(None, description="0-2; 0 is greedy")
    top_p: float | None = Field(None, description="0-1")
    n: int | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    seed: int | None = Field(None, description="0 to 2**32-1; echoed in X-miLLM-Seed")
    stop: str | list[str] | None = None
    frequency_penalty: float | None = Field(None, description="-2 to 2, OpenAI's additive definition")
    presence_penalty: float | None = Field(None, description="-2 to 2, OpenAI's additive definition")
    repetition_penalty: float | None = Field(None, description="vLLM's multiplicative penalty on every token of the "
                                                               "prompt and the answer so far, 0.01 to 10; 1 is off")


class _Readout(_Sampling):
    return_sae_activations: dict[str, Any] | None = Field(
        None, description="miLLM: this request's activations of an attached SAE (sae_id, features, top_k, "
                          "positions, read_point)")
    steering_scope: Any = Field(  # checked by millm.steering.scope.parse_scope
        None, description='miLLM: where this request\'s steering applies: "all" positions (default), only the '
                          '"generated" ones, or only the "prompt"\'s',
        json_schema_extra={"anyOf": [{"enum": ["all", "generated", "prompt"]}, {"type": "null"}]})
    probes: Any = Field(  # checked by millm.probes.serving.parse_asks
        None, description='miLLM: probes that watch this request besides the attached ones: names, or {"name", '
                          '"action": "flag"|"abort"|"steer", "profile"}; verdicts in millm.probes',
        json_schema_extra={"anyOf": [{"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "object"}]}},
                                     {"type": "null"}]})


class ChatCompletionRequest(_Readout):
    messages: list[dict[str, Any]]
    profile: str | None = Field(None, description="miLLM: a saved steering profile for this request only")
    steering_intensity: Any = Field(  # checked by millm.steering.intensity.parse_intensity
        None, description='miLLM: this request\'s steering dial, a λ from 0 to 2 or "off", "min", "max"',
        json_schema_extra={"anyOf": [{"type": "number", "minimum": 0, "maximum": 2},
                                     {"enum": ["off", "min", "max"]}, {"type": "null"}]})
    extra_messages: list[list[dict[str, Any]]] | None = Field(
        None, description="miLLM: further conversations answered in the same request, each its own choice")
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = Field(
        None, description="Functions the model may call; arguments are enforced against each one's parameters")
    tool_choice: str | dict[str, Any] | None = Field(
        None, description='"auto", "none", "required" or {"type": "function", "function": {"name": ...}}')
    parallel_tool_calls: bool | None = None


class CompletionRequest(_Readout):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        description="Text, texts, token ids, or lists of token ids (one choice each)")


class EmbeddingRequest(_Wire):
    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: str | None = Field(None, description="float (default) or base64")


W = TypeVar("W", bound=_Wire)


def parse(schema: type[W], body: Any) -> W:
    """Check the body's shape; the first problem becomes a 400 naming the field's location."""
    if not isinstance(body, dict):
        raise InvalidParameter("The request body must be a JSON object.")
    try:
        return schema.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        field, *rest = first["loc"] or ("body",)
        loc = str(field) + "".join(f"[{p}]" for p in rest if isinstance(p, int))
        raise InvalidParameter(f"'{loc}': {first['msg']}.", param=loc) from None
