"""Settings read from the environment (prefix ``MILLM_``) with safe defaults."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from platformdirs import user_data_dir
from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# the steering dial's envelope: every λ (steering_intensity, a cluster's stored dial, a declared
# intensity_range) lies in it
ENVELOPE: tuple[float, float] = (0.0, 2.0)
DEFAULT_DIAL = 1.0
"""A cluster's persistent dial until an operator sets it: the authored strengths as they are."""


class Settings(BaseSettings):
    """Everything an operator can tune without touching code."""

    model_config = SettingsConfigDict(env_prefix="MILLM_", extra="ignore")

    home: Path = Field(default_factory=lambda: Path(user_data_dir("millm")))
    default_model: str = "SmolLM2-135M-Instruct"
    device: str = "auto"
    dtype: str = "auto"
    # MILLM_WEIGHTS (--weights): "int8" keeps the decoder layers' linear weights in 8 bits (transformers on the CPU,
    # float32 activations; refused elsewhere), "dtype" in MILLM_DTYPE, "auto" the CPU default (docs/settings.md)
    weights: Literal["auto", "dtype", "int8"] = "auto"
    default_max_tokens: int = 1024
    max_queue: int = 32
    # what one request may ask for (millm.requests.limits): past these it is refused with 400 naming the field
    max_rows: int = Field(default=128, ge=1)  # generated choices: conversations or prompts x n
    max_prompts: int = Field(default=256, ge=1)  # conversations (messages + extra_messages) or prompts
    max_embedding_inputs: int = Field(default=2048, ge=1)  # inputs of one embeddings request
    max_prompt_tokens: int = Field(default=131072, ge=1)  # prompt tokens over every row of one request
    batching: bool = False  # MILLM_BATCHING / serve --batching: continuous batching of generations
    batch_max_rows: int = Field(default=16, ge=1)  # rows decoded together
    batch_max_tokens: int = Field(default=32768, ge=1)  # KV token budget, split into one slot per row
    batch_prefill_chunk: int = Field(default=256, ge=1)  # tokens in one merged prefill forward (rows x width)
    batching_monitoring: Literal["batch", "serial"] = "batch"  # serial: monitored requests skip the batch
    # MILLM_BATCHING_CONSTRAINTS: "batch" serves response_format and tools in the batch, per row; "refuse" is the
    # spec's rule (response_format 400 while batching is on, tool calls on the serial path)
    batching_constraints: Literal["batch", "refuse"] = "batch"
    graceful_unload_timeout: float = Field(default=30.0, ge=0)  # seconds running requests get before an unload
    preflight_timeout: float = Field(default=30.0, gt=0)  # seconds a load's file checks may take (then 500)
    api_key: str | None = None
    admin_key: str | None = None
    # MILLM_ALLOWED_HOSTS: names beyond loopback that a loopback-bound server answers to (comma-separated,
    # ".example.com" for a domain and its subdomains, "*" for any); other names answer 421 (millm.server.origins)
    allowed_hosts: str = ""
    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)  # a larger request body answers 413
    body_timeout: float = Field(default=60.0, gt=0)  # seconds a request body may take to arrive (then 408)
    cache: Path | None = None  # MILLM_CACHE: derived artefacts elsewhere than MILLM_HOME/cache
    intensity_max: float = Field(default=2.0, gt=ENVELOPE[0], le=ENVELOPE[1])
    cluster_intensity_min: float = Field(default=0.5, ge=ENVELOPE[0], le=ENVELOPE[1])
    circuit_intensity_min: float = Field(default=0.0, ge=ENVELOPE[0], le=ENVELOPE[1])
    # MILLM_TOOLS: "honour" calls tools by constrained decoding (transformers); "refuse" answers tools and
    # tool_choice with 400 field_not_honoured, the spec's table (docs/structured.md)
    tools: Literal["honour", "refuse"] = "honour"
    # MILLM_UNDECLARED_PROPERTIES: "omit" generates an object that declares properties and leaves
    # additionalProperties unset without undeclared keys (xgrammar's strict reading); "allow" as JSON Schema's
    # literal reading (docs/structured.md)
    undeclared_properties: Literal["omit", "allow"] = "omit"
    # MILLM_GGUF_STEERING: SAEs attach to GGUF models and steer llama.cpp through its control vectors (profile and
    # steering_intensity honoured on GGUF chat); off, the spec's table refuses them (docs/gguf.md)
    gguf_steering: bool = False
    # MILLM_CONSOLE: the web console at / (docs/console.md); false (or serve --no-console) leaves / a 404
    console: bool = True

    @model_validator(mode="after")
    def _dial_floors_below_max(self) -> Settings:
        """The steering dial's default floors cannot sit above its ceiling."""
        for name in ("cluster_intensity_min", "circuit_intensity_min"):
            if getattr(self, name) > self.intensity_max:
                raise ValueError(f"MILLM_{name.upper()} must not exceed MILLM_INTENSITY_MAX ({self.intensity_max}).")
        return self

    @property
    def cache_dir(self) -> Path:
        """Where dequantised weights and other derived artefacts live."""
        return self.cache or self.home / "cache"

    @property
    def models_dir(self) -> Path:
        """Where model checkpoints registered by the user live."""
        return self.home / "models"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (read once; tests clear the cache to change them)."""
    return Settings()
