"""The Flask layer of the admission webhook: HTTP in, the engine's answer out.

``create_app(config)`` builds the app; nothing exists at import time, so gunicorn's
``wsgi_app = "gpu_slicer.webhook.app:create_app()"`` makes one per worker after the fork. The
view only checks what is HTTP's business, then hands the decoded body to the engine:

- a body over 3 MiB (the apiserver's own cap), with a length or chunked: 413;
- a content type other than ``application/json``: 415;
- a body that is not JSON (or nests too deeply to decode), or a review the engine calls
  malformed (:class:`BadReview`): 400;
- an internal failure (:class:`TemplateError`, an API the caches could not reach, no policy
  loaded): 500, so that the webhook's failurePolicy decides.

``/healthz`` answers while the process serves; ``/readyz`` only once the policy is loaded and the
caches have synced; ``/metrics`` is the Prometheus exposition (summed over gunicorn workers).
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from flask import Blueprint, Flask, Response, current_app, request

from gpu_slicer.webhook.config import MAX_BODY_BYTES, ServerConfig
from gpu_slicer.webhook.engine import compact_json
from gpu_slicer.webhook.errors import BadReview, WebhookError

if TYPE_CHECKING:
    from gpu_slicer.webhook.server import Runtime

log = logging.getLogger(__name__)
RUNTIME_KEY = "gpu_slicer.runtime"

admission = Blueprint("admission", __name__)
probes = Blueprint("probes", __name__)


def runtime() -> Runtime:
    """The per-app runtime (engine, metrics, readiness) of the current request."""
    value: Runtime = current_app.extensions[RUNTIME_KEY]
    return value


def _json(status: int, payload: Any) -> Response:
    return Response(
        compact_json(payload),
        status=status,
        mimetype="application/json",
    )


def _error(status: int, outcome: str, message: str, started: float) -> Response:
    rt = runtime()
    rt.metrics.count(rt.metrics.requests, outcome, "n/a")
    rt.metrics.latency.observe(time.perf_counter() - started)
    return _json(status, {"error": message})


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() == "application/json"


@admission.post("/mutate-pods")
def mutate_pods() -> Response:
    started = time.perf_counter()
    length = request.content_length
    if length is not None and length > MAX_BODY_BYTES:
        return _error(413, "too_large", f"request body over {MAX_BODY_BYTES} bytes", started)
    if not _is_json(request.content_type):
        return _error(
            415,
            "unsupported_media_type",
            f"expected Content-Type application/json, got {request.content_type or 'none'!r}",
            started,
        )
    # A body without a length (chunked) is read up to one byte past the limit
    # (MAX_CONTENT_LENGTH), so that a longer one is told apart from one exactly at it.
    raw = request.get_data(cache=False)
    if len(raw) > MAX_BODY_BYTES:
        return _error(413, "too_large", f"request body over {MAX_BODY_BYTES} bytes", started)
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return _error(400, "bad_request", f"the body is not JSON: {exc}", started)
    except RecursionError:
        return _error(
            400,
            "bad_request",
            "the body is not JSON this server accepts: nested "
            "too deeply (an AdmissionReview nests a few dozen levels)",
            started,
        )
    rt = runtime()
    try:
        result = rt.reviewer.review(body, raw)
    except BadReview as exc:
        return _error(400, "bad_request", f"malformed AdmissionReview: {exc.message}", started)
    except WebhookError as exc:
        log.error("admission failed; failurePolicy decides", extra={"error": str(exc)})
        return _error(500, "error", str(exc), started)
    except Exception:
        log.exception("admission failed unexpectedly; failurePolicy decides")
        return _error(500, "error", "internal error while reviewing the pod", started)
    metrics = rt.metrics
    metrics.count(metrics.requests, result.outcome, result.mode)
    for _container, resource in result.changes:
        metrics.count(metrics.conversions, resource, result.mode)
    for _container, resource in result.deferred:
        metrics.count(metrics.deferred, resource, result.mode)
    reply = _json(200, result.body)
    metrics.latency.observe(time.perf_counter() - started)
    return reply


@probes.get("/healthz")
def healthz() -> Response:
    return _json(200, {"status": "ok"})


@probes.get("/readyz")
def readyz() -> Response:
    problems = runtime().readiness()
    if problems:
        return _json(503, {"status": "not ready", "problems": problems})
    return _json(200, {"status": "ready"})


@probes.get("/metrics")
def metrics() -> Response:
    body, content_type = runtime().metrics.exposition()
    return Response(body, status=200, content_type=content_type)


def create_app(config: ServerConfig | None = None, *, runtime: Runtime | None = None) -> Flask:
    """The webhook app. Without ``runtime`` one is built (and started) from ``config``, which
    defaults to the ``GPU_SLICER_*`` environment (how gunicorn workers get their settings)."""
    if runtime is None:
        from gpu_slicer.webhook.server import build_runtime

        runtime = build_runtime(config or ServerConfig.from_env())
    app = Flask("gpu_slicer_webhook")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES + 1  # see mutate_pods: one byte more
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions[RUNTIME_KEY] = runtime
    app.register_blueprint(admission)
    app.register_blueprint(probes)

    @app.errorhandler(413)
    def too_large(_exc: Exception) -> Response:
        runtime_of_app = app.extensions[RUNTIME_KEY]
        runtime_of_app.metrics.requests.labels(outcome="too_large", mode="n/a").inc()
        return _json(413, {"error": f"request body over {MAX_BODY_BYTES} bytes"})

    @app.errorhandler(404)
    def not_found(_exc: Exception) -> Response:
        return _json(404, {"error": f"no such endpoint {request.method} {request.path}"})

    @app.errorhandler(405)
    def not_allowed(_exc: Exception) -> Response:
        return _json(405, {"error": f"{request.method} is not allowed on {request.path}"})

    return app
