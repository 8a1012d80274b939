"""The Quart application: /v1, /api and the one place errors become OpenAI-shaped bodies."""

from __future__ import annotations

import logging
from typing import Any

from quart import Quart, request
from werkzeug.exceptions import HTTPException

from millm.config import Settings
from millm.engine import Engine, load_engine
from millm.engine.decode.admission import BatchSettings
from millm.engine.manager import Loader, ModelManager, Registry
from millm.engine.worker import EngineWorker
from millm.errors import MillmError
from millm.server import (
    api,
    auth,
    body_limits,
    console,
    features_api,
    health,
    measure_api,
    metrics,
    models_api,
    openapi,
    origins,
    probes_api,
    pulls,
    sensing,
    steering_docs,
    sweeps_api,
    v1,
    vectors_api,
)
from millm.server.state import Services
from millm.steering.intensity import IntensitySettings
from millm.steering.service import SteeringService
from millm.store import Store

log = logging.getLogger(__name__)


def create_app(settings: Settings, engine: Engine | None = None, loader: Loader = load_engine,
               registry: Registry | None = None) -> Quart:
    """An app serving ``engine`` (already loaded); without one, /v1 answers model_not_loaded.

    ``loader`` loads the model a request names and ``registry`` finds it (tests give scripted ones)."""
    app = Quart("millm")
    app.config.update(RESPONSE_TIMEOUT=None)
    body_limits.install(app, settings)
    origins.install(app)
    auth.install(app)
    worker = EngineWorker(settings.max_queue, BatchSettings.from_settings(settings))
    steering = SteeringService(Store(settings.home / "millm.db"), IntensitySettings.from_settings(settings))
    if engine is not None:
        steering.restore(engine.steering_target())
    manager = ModelManager(settings, worker, engine, on_load=lambda e: steering.restore(e.steering_target()),
                           loader=loader, registry=registry)
    app.extensions["millm"] = Services(settings, worker, manager, steering)
    metrics.install(app, app.extensions["millm"])
    app.register_blueprint(v1.bp)
    app.register_blueprint(health.bp)
    app.register_blueprint(api.bp)
    app.register_blueprint(steering_docs.bp)
    app.register_blueprint(models_api.bp)
    app.register_blueprint(pulls.bp)
    app.register_blueprint(vectors_api.bp)
    app.register_blueprint(sweeps_api.bp)
    app.register_blueprint(features_api.bp)
    app.register_blueprint(measure_api.bp)
    app.register_blueprint(probes_api.bp)
    sensing.install(app)
    if settings.console:  # MILLM_CONSOLE / serve --no-console: the web console at /
        app.register_blueprint(console.bp)

    async def openapi_document() -> Any:
        """This server's OpenAPI document."""
        return openapi.build(app)

    app.add_url_rule("/openapi.json", "openapi", openapi_document, methods=["GET"])

    @app.errorhandler(MillmError)
    async def millm_error(exc: MillmError) -> Any:
        return exc.body(), exc.status

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Any:
        status = exc.code or 500
        message = exc.description or exc.name
        if status == 404:
            served = sorted({rule.rule for rule in app.url_map.iter_rules() if rule.rule.startswith("/v1/")
                             and "<" not in rule.rule})
            message = (f"miLLM does not serve {request.method} {request.path}; its OpenAI routes are "
                       f"{', '.join(served)} (and /v1/models/{{id}}), its management API is under /api.")
        body = {"error": {"message": message, "type": "invalid_request_error", "param": None,
                          "code": exc.name.lower().replace(" ", "_")}}
        return body, status

    @app.errorhandler(Exception)
    async def unexpected(exc: Exception) -> Any:
        log.exception("unhandled error")
        return MillmError(f"Internal error: {exc}").body(), 500

    @app.after_serving
    async def stop_worker() -> None:
        worker.shutdown()

    return app
