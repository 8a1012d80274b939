"""A probe as it is stored and exchanged: one JSON document, direction inline, with its operating point, the
evidence for it, and the model it was learned on.

``Probe`` is the stored record; ``watch`` turns it into what a request serves (``millm.steering.probe.Watch``)
with an action. A probe for another model (its id, hidden size, layer count or chat template differ) is refused
when it is attached or asked for, naming both (``check_model``)."""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from millm.errors import InvalidParameter
from millm.names import check_name
from millm.steering.probe import Watch, check_action, check_aggregation

if TYPE_CHECKING:
    from millm.engine.base import Engine
    from millm.steering.core import RequestSteering

KIND = "probe"
METHODS = ("diffmean", "logreg")
DEFAULT_FPR = 0.01


class ProbeForAnotherModel(InvalidParameter):
    """A probe learned on another model than the one loaded (a 400 naming both)."""

    code = "probe_model_mismatch"


@dataclass(frozen=True)
class ModelIdentity:
    """What a probe's direction is only valid for: the model's id, hidden size, layer count and chat template
    (its SHA-256; "" without one)."""

    id: str
    hidden_size: int
    layers: int
    chat_template_sha256: str

    @classmethod
    def of(cls, model_id: str, hidden_size: int, layers: int, template: str | None) -> ModelIdentity:
        return cls(model_id, hidden_size, layers, hashlib.sha256(template.encode()).hexdigest() if template else "")

    def describe(self) -> str:
        return (f"'{self.id}' (hidden size {self.hidden_size}, {self.layers} layers, chat template "
                f"{self.chat_template_sha256[:12] or 'none'})")


@dataclass(frozen=True)
class Figures:
    """The operating point's evidence on the held-out examples: AUROC, recall and the realised false-positive
    rate at the threshold, and how many examples of each side it was measured on (and trained on)."""

    auroc: float
    recall: float
    fpr: float
    target_fpr: float
    held_out: dict[str, int]
    train: dict[str, int]


@dataclass(frozen=True)
class Probe:
    """A stored probe: ``score = weight . h + bias`` at ``layer``'s output at each position read, aggregated over
    ``span`` (a ``rolling_mean`` over ``window`` response tokens) and compared with ``threshold``; the held-out
    ``scores`` (and ``held_out`` texts) it was cut on."""

    name: str
    layer: int
    method: str
    weight: list[float]
    bias: float
    aggregation: str
    span: str
    threshold: float
    figures: Figures
    model: ModelIdentity
    source: dict[str, Any] = field(default_factory=dict)
    scores: dict[str, list[float]] = field(default_factory=dict)  # held-out scores of each side
    held_out: dict[str, list[str]] = field(default_factory=dict)  # the held-out texts of each side
    description: str = ""
    window: int | None = None  # a rolling mean's window (response tokens); None for the other aggregations

    def document(self) -> dict[str, Any]:
        """The probe as one JSON document (what export writes and import reads)."""
        return {"kind": KIND, **asdict(self)}

    def summary(self) -> dict[str, Any]:
        """What a listing shows: the document without its direction, scores and texts."""
        doc = self.document()
        for key in ("weight", "scores", "held_out"):
            doc.pop(key)
        return doc

    def check_model(self, identity: ModelIdentity) -> None:
        """Refuse this probe for a model other than its own, naming both."""
        if identity != self.model:
            raise ProbeForAnotherModel(f"Probe '{self.name}' was learned on {self.model.describe()}; the loaded model "
                                       f"is {identity.describe()}.", param="probes")

    def watch(self, action: str = "flag", profile: str | None = None, steering: RequestSteering | None = None,
              param: str = "action") -> Watch:
        """What a request serves: this probe, acting as ``action`` (``steering``: its profile's, resolved); an
        action it cannot take is a 400 naming ``param``."""
        check_action(action, profile, self.aggregation, self.span, param)
        return Watch(self.name, self.layer, self.weight, self.bias, self.aggregation, self.span, self.threshold, action,
                     profile, steering, self.window)


def identity(engine: Engine) -> ModelIdentity:
    """The loaded model's identity (a transformers engine's: its tokenizer holds the chat template); an engine
    whose residual stream cannot be read is a 400."""
    target = engine.steering_target()
    if target is None or not engine.capabilities.reads:
        raise InvalidParameter(f"Probes read the residual stream: they need a transformers model ('{engine.model_id}'"
                               f" runs on {engine.engine_name}).", param="model")
    template = getattr(getattr(engine, "tokenizer", None), "chat_template", None)
    return ModelIdentity.of(engine.model_id, target.steering.d_model, target.steering.n_layers,
                            template if isinstance(template, str) else None)


def from_document(doc: Any, name: str | None = None) -> Probe:
    """A probe from its document (``name`` renames it), every field checked: a 400 naming the first bad one."""
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise InvalidParameter("A probe document is a JSON object with \"kind\": \"probe\".", param="kind")
    try:
        figures, model = doc["figures"], doc["model"]
        probe = Probe(check_name(name or doc["name"]), _int(doc["layer"], "layer"), str(doc["method"]),
                      [float(x) for x in doc["weight"]], float(doc["bias"]), doc["aggregation"], doc["span"],
                      float(doc["threshold"]),
                      Figures(float(figures["auroc"]), float(figures["recall"]), float(figures["fpr"]),
                              check_fpr(figures["target_fpr"]), dict(figures["held_out"]), dict(figures["train"])),
                      ModelIdentity(str(model["id"]), _int(model["hidden_size"], "model.hidden_size"),
                                    _int(model["layers"], "model.layers"), str(model["chat_template_sha256"])),
                      dict(doc.get("source") or {}), _lists(doc.get("scores"), float),
                      _lists(doc.get("held_out"), str), str(doc.get("description") or ""))
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidParameter(f"The probe document is missing or has a malformed field: {exc}.",
                               param="document") from None
    _, _, window = check_aggregation(probe.aggregation, probe.span, doc.get("window"))
    probe = replace(probe, window=window)
    if len(probe.weight) != probe.model.hidden_size or not all(math.isfinite(x) for x in probe.weight):
        raise InvalidParameter(f"'weight' must hold {probe.model.hidden_size} finite numbers (the model's hidden "
                               "size).", param="weight")
    if not (math.isfinite(probe.bias) and math.isfinite(probe.threshold)):
        raise InvalidParameter("'bias' and 'threshold' must be finite numbers.", param="threshold")
    return probe


def check_fpr(value: Any, param: str = "target_fpr") -> float:
    """A target false-positive rate strictly between 0 and 1, or a 400 naming ``param``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise InvalidParameter(f"'{param}' must be a number strictly between 0 and 1, got {value!r}.", param=param)
    return float(value)


def _int(value: Any, param: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidParameter(f"'{param}' must be a non-negative integer.", param=param)
    return value


def _lists(value: Any, kind: type) -> dict[str, list[Any]]:
    return {str(k): [kind(x) for x in v] for k, v in (value or {}).items()}
