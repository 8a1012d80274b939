"""Domain errors. Each knows its HTTP status, OpenAI error type and code, written once here."""

from __future__ import annotations

from typing import Any


class MillmError(Exception):
    """Base of every error miLLM reports to a user."""

    status: int = 500
    type: str = "server_error"
    code: str = "internal_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        """The OpenAI-shaped error body."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class InvalidParameter(MillmError):
    """A request field has a value miLLM cannot accept."""

    status, type, code = 400, "invalid_request_error", "invalid_parameter"


class ContextLengthExceeded(MillmError):
    """Prompt plus requested completion does not fit in the model's context window."""

    status, type, code = 400, "invalid_request_error", "context_length_exceeded"

    def __init__(self, requested: int, available: int, *, prompt_tokens: int | None = None,
                 param: str | None = "messages", detail: str | None = None, lower_bound: str | None = None) -> None:
        """``detail`` adds a sentence (what the prompt's tokens are made of); ``lower_bound`` says why at least
        ``requested`` tokens are needed when the prompt was refused before it was tokenised."""
        counted = f" ({prompt_tokens} in the prompt)" if prompt_tokens is not None else ""
        if lower_bound is not None:
            asked = f"at least {requested} tokens are needed ({lower_bound})"
        else:
            asked = f"{requested} tokens were requested{counted}"
        super().__init__(
            f"This model's maximum context length is {available} tokens, but {asked}. "
            + (f"{detail} " if detail else "") + "Shorten the prompt or lower max_tokens.",
            param=param,
        )
        self.requested = requested
        self.available = available


class FieldNotHonoured(MillmError):
    """An output-changing field this endpoint or engine cannot honour."""

    status, type, code = 400, "invalid_request_error", "field_not_honoured"


class UnusedFieldsRefused(MillmError):
    """Strict mode and the request carried fields the path does not use."""

    status, type, code = 400, "invalid_request_error", "unused_fields_refused"


class ModelNotFound(MillmError):
    """The named model is not on disk, bundled or in the local HuggingFace cache."""

    status, type, code = 404, "invalid_request_error", "model_not_found"

    def __init__(self, model: str) -> None:
        super().__init__(f"The model '{model}' does not exist; see `millm models list` or GET /v1/models.",
                         param="model")


class AmbiguousModelName(MillmError):
    """A bare GGUF repo name while several quantizations of it exist."""

    status, type, code = 400, "invalid_request_error", "AMBIGUOUS_MODEL_NAME"

    def __init__(self, model: str, tags: list[str]) -> None:
        names = ", ".join(f"{model}:{t}" for t in tags)
        super().__init__(f"'{model}' names several quantizations ({', '.join(tags)}); ask for one of: {names}.",
                         param="model")


class ModelNotLoaded(MillmError):
    """No model is loaded to serve the request."""

    status, type, code = 503, "server_error", "model_not_loaded"


class ModelBusy(MillmError):
    """A load or unload is under way: retry once it finishes."""

    status, type, code = 503, "server_error", "model_busy"


class ModelLoadFailed(MillmError):
    """Loading the named model failed."""

    status, type, code = 500, "server_error", "model_load_failed"


class QueueFull(MillmError):
    """The request queue is full (backpressure)."""

    status, type, code = 503, "server_error", "queue_full"


class RequestTooLarge(MillmError):
    """The request body is larger than MILLM_MAX_BODY_BYTES."""

    status, type, code = 413, "invalid_request_error", "request_too_large"


class RequestTimeout(MillmError):
    """The request body did not arrive within MILLM_BODY_TIMEOUT seconds."""

    status, type, code = 408, "invalid_request_error", "request_timeout"


class Unauthorized(MillmError):
    """A key is configured and the request did not carry it."""

    status, type, code = 401, "invalid_request_error", "invalid_api_key"


class ManagementForbidden(MillmError):
    """A management change on a server bound beyond loopback with no key set: nobody can be trusted with it."""

    status, type, code = 403, "invalid_request_error", "management_forbidden"


class CrossOriginForbidden(MillmError):
    """A state-changing request sent by a web page of another origin (the browser says so in ``Origin``)."""

    status, type, code = 403, "invalid_request_error", "cross_origin_forbidden"


class HostNotAllowed(MillmError):
    """A loopback server addressed by a name that is not its own (DNS rebinding)."""

    status, type, code = 421, "invalid_request_error", "host_not_allowed"


class UnsupportedMediaType(MillmError):
    """A request body that does not say it is JSON."""

    status, type, code = 415, "invalid_request_error", "unsupported_media_type"


class InvalidSAE(MillmError):
    """An SAE file is malformed; the message names the file and the key."""

    status, type, code = 400, "invalid_request_error", "invalid_sae"


class SAENotFound(MillmError):
    """No registered SAE has this id."""

    status, type, code = 404, "invalid_request_error", "sae_not_found"


class SAENotAttached(MillmError):
    """The SAE is registered but not attached to the loaded model."""

    status, type, code = 400, "invalid_request_error", "sae_not_attached"


class InvalidFeatureIndex(MillmError):
    """A feature index past the SAE's width, or a steering value that cannot apply."""

    status, type, code = 400, "invalid_request_error", "invalid_feature_index"


class ProfileNotFound(MillmError):
    """No saved profile has this name."""

    status, type, code = 404, "invalid_request_error", "profile_not_found"


class ProfileConflict(MillmError):
    """A profile with this name exists already."""

    status, type, code = 409, "invalid_request_error", "profile_exists"


class InvalidScoringRequest(MillmError):
    """A scoring request that cannot be scored: a token id outside the vocabulary, an empty prompt."""

    status, type, code = 400, "invalid_request_error", "invalid_scoring_request"


class NonFiniteLogits(MillmError):
    """NaN or infinite logits reached the answer of a scoring request, or a batched row's next token."""

    status, type, code = 500, "server_error", "non_finite_logits"


class NoChatTemplate(MillmError):
    """Chat scoring on a model that ships no chat template."""

    status, type, code = 400, "invalid_request_error", "no_chat_template"


class ResponseFormatUnsupported(MillmError):
    """A response_format miLLM cannot enforce: a schema keyword, or a combination with other fields."""

    status, type, code = 400, "invalid_request_error", "response_format_unsupported"


class ConstrainedOutputInvalid(MillmError):
    """The model closed a constrained document that does not validate against its schema."""

    status, type, code = 500, "server_error", "constrained_output_invalid"


class UnsupportedQuantization(MillmError):
    """The named model has to be loaded and its quantization cannot be run by its engine."""

    status, type, code = 400, "invalid_request_error", "unsupported_quantization"


class InsufficientMemory(MillmError):
    """No card (or the system's RAM) holds the model, or generation ran a card out of memory."""

    status, type, code = 503, "invalid_request_error", "insufficient_memory"


class ModelLocked(MillmError):
    """The server is locked to one model for steering and the request names another."""

    status, type, code = 409, "invalid_request_error", "model_locked"


class InvalidModelFiles(MillmError):
    """A registered model's files are malformed (config.json, a safetensors or GGUF header): no retry can
    load it, so the request naming it is refused before the loaded model is unloaded."""

    status, type, code = 422, "invalid_request_error", "invalid_model_files"


class UnsupportedArchitecture(MillmError):
    """The loaded model's layers are of a kind miLLM's decode loop does not run (a recurrent or convolutional
    layer, whose state is not a key-value cache): generation is refused, naming the layer types."""

    status, type, code = 400, "invalid_request_error", "unsupported_architecture"
