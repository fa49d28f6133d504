"""gunicorn configuration of the gpu-slicer admission webhook (plain Python, checkable with
``gunicorn --check-config -c webhook/gunicorn.conf.py``).

Settings come from the ``GPU_SLICER_*`` environment (``webhook serve`` writes it from its flags;
see webhook/config.py), so the same file serves the CLI, a container's plain ``gunicorn`` command
and the tests.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpu_slicer.webhook.config import MULTIPROC_ENV, ServerConfig

# Workers share a folder for the template-GC lock and for prometheus-client's per-process
# files; both are set in the environment before any worker imports prometheus_client.
_config = ServerConfig.from_env().with_runtime_folders()

# --- Application --------------------------------------------------------------------------
wsgi_app = "gpu_slicer.webhook.app:create_app()"
proc_name = "gpu-slicer-webhook"

# --- Socket -------------------------------------------------------------------------------
bind = [_config.bind]
backlog = 1024
control_socket_disable = True  # gunicorn >= 25: no management socket in $HOME

# --- Workers ------------------------------------------------------------------------------
# gevent greenlets with a read deadline (webhook/worker.py): a connection costs a greenlet, not
# a thread, so clients that stall take no capacity from others, and a connection that has not
# delivered its handshake and a whole request within GPU_SLICER_READ_TIMEOUT_S is closed.
# gthread (a thread per connection being read) let eight stalled clients block every review.
worker_class = "gpu_slicer.webhook.worker.DeadlineGeventWorker"
workers = _config.workers
worker_connections = _config.connections
keepalive = 75  # seconds an idle kept-alive connection waits; the apiserver reuses connections
timeout = 30  # a worker silent this long is restarted; admission itself times out at <= 30 s
graceful_timeout = 20

# --- Request limits -------------------------------------------------------------------------
limit_request_line = 8190
limit_request_fields = 100
limit_request_field_size = 8190

# --- TLS ----------------------------------------------------------------------------------
# certfile/keyfile turn TLS on; the ssl_context hook replaces gunicorn's default factory (which
# loads the files for every connection) with a cached context that is rebuilt only when the
# files change, checked at most every GPU_SLICER_TLS_CHECK_S seconds. A rotated certificate is
# served on new connections without a restart; a half-written pair keeps the old one. With
# GPU_SLICER_CLIENT_CA, clients must present a certificate that CA signed (mutual TLS).
certfile = _config.tls_cert
keyfile = _config.tls_key
_contexts: dict[tuple[str, str], Any] = {}


def ssl_context(conf: Any, default_ssl_context_factory: Any) -> Any:
    from gpu_slicer.certs.reload import ReloadingSSLContext

    key = (conf.certfile, conf.keyfile)
    reloading = _contexts.get(key)
    if reloading is None:
        reloading = ReloadingSSLContext(
            conf.certfile,
            conf.keyfile,
            check_interval_s=_config.tls_check_s,
            client_ca=_config.client_ca,
        )
        _contexts[key] = reloading
    return reloading.context()


# --- Logging ------------------------------------------------------------------------------
# One JSON object per line on stderr, like every gpu-slicer component. No access log: the
# metrics count requests, and a line per admission is noise at hundreds per second.
accesslog = None
errorlog = "-"
loglevel = _config.log_level.lower()
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "gpu_slicer.cli.logs.JsonFormatter"}},
    "handlers": {
        "stderr": {
            "class": "logging.StreamHandler",
            "formatter": "json",
            "stream": "ext://sys.stderr",
        }
    },
    "root": {"level": _config.log_level.upper(), "handlers": ["stderr"]},
    "loggers": {
        "gunicorn.error": {
            "level": _config.log_level.upper(),
            "handlers": ["stderr"],
            "propagate": False,
        },
        "gunicorn.access": {"level": "WARNING", "handlers": ["stderr"], "propagate": False},
    },
}


# --- Hooks --------------------------------------------------------------------------------
def on_starting(server: Any) -> None:
    """A fresh metrics folder: files of a previous run would be summed into this one."""
    folder = Path(os.environ[MULTIPROC_ENV])
    for stale in folder.glob("*.db"):
        stale.unlink(missing_ok=True)


def post_worker_init(worker: Any) -> None:
    """What the worker has loaded (modules, the app, its caches) lives as long as it does:
    frozen out of the garbage collector, it is no longer walked by every full collection, which
    reviews that translate pods (and fill the caches) trigger every few thousand requests."""
    import gc

    gc.freeze()


def child_exit(server: Any, worker: Any) -> None:
    """Drop a dead worker's live values from the summed metrics."""
    from gpu_slicer.webhook.metrics import mark_process_dead

    mark_process_dead(worker.pid)


def worker_int(worker: Any) -> None:
    worker.log.info("worker interrupted", extra={"pid": worker.pid})
