"""GET /metrics: the server's Prometheus metrics, one registry per app (tests make many apps).

Counted as requests pass: requests by route and status, request latency (a streamed response is timed to
its last byte), prompt and completion tokens, time to first token, steered requests. Read at scrape time
from the live objects: queue depth and requests running, engine busy seconds, the loaded model, whether
steering is enabled and steering anything, GPU memory in use; and the process's own (resident memory, CPU).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from quart import Quart, Response, current_app, g, request
from quart.wrappers.response import IterableBody

from millm.engine.events import Delta, Usage
from millm.server.auth import require_api_key
from millm.server.state import Services

EXTENSION = "millm_metrics"
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
COUNTED = "_millm_tokens_counted"  # g flag: the request's tokens were counted from its events
STARTED = "_millm_started"  # g: monotonic time the request began
E = TypeVar("E")
# the method label's values: any other method (a client may send any token) is counted as OTHER, so no
# request, with a key or without, can add a series
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"})
OTHER_METHOD = "OTHER"


def device_memory() -> list[tuple[str, int]]:
    """Bytes torch holds on each GPU it has started; none where it has not (torch is never imported for this)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return []
    return [(f"cuda:{i}", int(torch.cuda.memory_allocated(i))) for i in range(torch.cuda.device_count())]


class Live(Collector):
    """What is read from the server's objects at scrape time."""

    def __init__(self, services: Services) -> None:
        self.services = services

    def collect(self) -> Iterator[Metric]:
        worker, manager = self.services.worker, self.services.manager
        running = worker.running
        yield GaugeMetricFamily("millm_queue_depth", "Requests admitted and waiting for the engine.",
                                value=max(worker.pending - running, 0))
        yield GaugeMetricFamily("millm_requests_running", "Requests the engine is working on now.", value=running)
        yield CounterMetricFamily("millm_engine_busy_seconds", "Seconds the engine thread spent on work.",
                                  value=worker.busy_seconds)
        engine = manager.engine
        loaded = GaugeMetricFamily("millm_model_loaded", "1 for the loaded model (labels: model, engine).",
                                   labels=["model", "engine"])
        if engine is not None:
            loaded.add_metric([engine.model_id, engine.engine_name], 1)
        yield loaded
        target = engine.steering_target() if engine is not None else None
        steering = target.steering if target is not None else None
        yield GaugeMetricFamily("millm_steering_enabled", "1 while steering is enabled on the loaded model.",
                                value=1 if steering is not None and steering.enabled else 0)
        yield GaugeMetricFamily("millm_steering_active", "1 while the live steering values steer anything.",
                                value=1 if steering is not None and steering.label() != "none" else 0)
        device = GaugeMetricFamily("millm_device_memory_bytes", "Bytes torch has allocated on each GPU in use.",
                                   labels=["device"])
        for name, used in device_memory():
            device.add_metric([name], used)
        yield device
        yield GaugeMetricFamily("millm_peak_resident_memory_bytes", "The process's largest resident set so far.",
                                value=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


class Metrics:
    """The metrics of one app: its own registry, counters fed by the request hooks and the event stream."""

    def __init__(self, services: Services) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, CPU seconds, open files
        self.requests = Counter("millm_requests", "HTTP requests answered, by route and status.",
                                ["route", "method", "status"], registry=self.registry)
        self.latency = Histogram("millm_request_latency_seconds", "Request latency to the last byte, by route.",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.ttft = Histogram("millm_time_to_first_token_seconds", "From the request's arrival to its first "
                              "generated text.", buckets=TTFT_BUCKETS, registry=self.registry)
        self.prompt_tokens = Counter("millm_prompt_tokens", "Prompt tokens processed.", registry=self.registry)
        self.completion_tokens = Counter("millm_completion_tokens", "Completion tokens generated.",
                                         registry=self.registry)
        self.steered = Counter("millm_steered_requests", "Responses steered (X-miLLM-Steering other than none).",
                               registry=self.registry)
        self.registry.register(Live(services))

    def count_usage(self, prompt: int, completion: int) -> None:
        self.prompt_tokens.inc(max(prompt, 0))
        self.completion_tokens.inc(max(completion, 0))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def of(app: Quart) -> Metrics:
    metrics: Metrics = app.extensions[EXTENSION]
    return metrics


def route() -> str:
    """The matched route's template (bounded label values); ``unmatched`` for a 404."""
    rule = request.url_rule
    return rule.rule if rule is not None else "unmatched"


def method_label(method: str) -> str:
    """The request's method as a label value: one of METHODS, else OTHER (bounded label values)."""
    return method if method in METHODS else OTHER_METHOD


def observed(events: AsyncIterator[E]) -> AsyncIterator[E]:
    """A generation's events, passed through while counting time to first text and the tokens used.

    Call inside the request (it reads the request's start and marks its tokens counted); iterate anywhere."""
    setattr(g, COUNTED, True)
    return _observe(events, of(current_app), g.get(STARTED, time.monotonic()))


async def _observe(events: AsyncIterator[E], metrics: Metrics, started: float) -> AsyncIterator[E]:
    first = True
    async for event in events:
        if first and isinstance(event, Delta) and event.text:
            metrics.ttft.observe(time.monotonic() - started)
            first = False
        elif isinstance(event, Usage):
            metrics.count_usage(event.prompt_tokens, event.completion_tokens)
        yield event


def usage_of(body: bytes) -> tuple[int, int] | None:
    """``(prompt_tokens, completion_tokens)`` from a JSON response's ``usage`` object, found without parsing
    the whole body (an embeddings answer can be megabytes)."""
    at = body.rfind(b'"usage"')
    end = body.find(b"}", at)
    if at < 0 or end < 0:
        return None
    start = body.find(b"{", at)
    try:
        usage = json.loads(body[start:end + 1])
    except ValueError:
        return None
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    return (prompt, completion) if isinstance(prompt, int) and isinstance(completion, int) else None


async def before() -> None:
    g.setdefault(STARTED, time.monotonic())


async def after(response: Response) -> Response:
    """Count the request; a streamed body is timed to its end, a JSON /v1 answer's usage is counted unless
    its events already were."""
    metrics = of(current_app)
    name, method, started = route(), method_label(request.method), g.get(STARTED, time.monotonic())
    metrics.requests.labels(name, method, str(response.status_code)).inc()
    steering = response.headers.get("X-miLLM-Steering")
    if steering is not None and steering != "none" and response.status_code == 200:
        metrics.steered.inc()
    if isinstance(response.response, IterableBody):
        response.response = IterableBody(_timed(response.response, metrics, name, started))
        return response
    metrics.latency.labels(name).observe(time.monotonic() - started)
    if (request.path.startswith("/v1/") and response.status_code == 200 and not g.get(COUNTED)
            and response.mimetype == "application/json"):
        found = usage_of(await response.get_data(as_text=False))
        if found is not None:
            metrics.count_usage(*found)
    return response


async def _timed(body: IterableBody, metrics: Metrics, name: str, started: float) -> AsyncIterator[Any]:
    try:
        async for chunk in body:
            yield chunk
    finally:
        metrics.latency.labels(name).observe(time.monotonic() - started)
        close = getattr(body.iter, "aclose", None)
        if close is not None:
            await close()


async def metrics_route() -> Response:
    """Prometheus metrics (text exposition format); needs the API key when one is set."""
    from millm.server.state import services

    require_api_key(services().settings, request.headers.get("Authorization", ""))
    return Response(of(current_app).render(), content_type=CONTENT_TYPE_LATEST)


def install(app: Quart, services: Services) -> None:
    """Give ``app`` its own metrics, the hooks that feed them and the GET /metrics route."""
    app.extensions[EXTENSION] = Metrics(services)
    app.before_request(before)
    app.after_request(after)
    app.add_url_rule("/metrics", "metrics", metrics_route, methods=["GET"])
