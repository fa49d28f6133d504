"""Wiring of ``gpu-slicer webhook serve``: settings -> runtime (engine and its sources) -> gunicorn.

:func:`build_runtime` assembles, per gunicorn worker, what the Flask app needs: the reloading
policy, the namespace and DeviceClass caches (or their static ``--dev`` twins), the template
ensurer and collector, the metrics and the readiness check. :func:`serve` validates the settings
and the policy up front (exit 2 with the problems), makes a self-signed certificate for
``--dev``, writes the settings to the environment and runs gunicorn with ``gunicorn.conf.py``.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import logging
import os
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from gpu_slicer.kube.api import KubeApi
from gpu_slicer.webhook.caches import (
    ExtendedResourceNames,
    NamespaceModes,
    NamespaceQuotas,
    StaticExtendedNames,
    StaticNamespaceModes,
    StaticQuotas,
)
from gpu_slicer.webhook.config import ConfigError, ServerConfig
from gpu_slicer.webhook.engine import AdmissionEngine, ReviewResult
from gpu_slicer.webhook.extended import Reporter
from gpu_slicer.webhook.policy import Policy, load_policy_file
from gpu_slicer.webhook.policy_reload import PolicyStore
from gpu_slicer.webhook.templates import (
    ApiTemplates,
    CollectorLoop,
    ReportingTemplates,
    TemplateCollector,
    TemplateEnsurer,
)

if TYPE_CHECKING:
    from gpu_slicer.webhook.metrics import Metrics

log = logging.getLogger(__name__)

GUNICORN_CONF = Path(__file__).with_name("gunicorn.conf.py")


RBAC_RULES: dict[tuple[str, str], frozenset[str]] = {
    ("", "namespaces"): frozenset({"get", "list", "watch"}),
    ("", "pods"): frozenset({"list"}),
    ("", "resourcequotas"): frozenset({"list", "watch"}),
    ("resource.k8s.io", "deviceclasses"): frozenset({"list", "watch"}),
    ("resource.k8s.io", "resourceclaimtemplates"): frozenset({"create", "patch", "list", "delete"}),
}
"""(API group, resource) -> verbs the webhook's service account needs (a ClusterRole)."""


class Reviewer(Protocol):
    def review(self, body: Any, raw: bytes | None = None) -> ReviewResult: ...


@dataclass
class Runtime:
    """Everything one app instance serves with; ``stop()`` ends its background threads."""

    reviewer: Reviewer
    metrics: Metrics
    readiness: Callable[[], list[str]] = lambda: []
    stoppers: list[Callable[[], None]] = field(default_factory=list)
    templates: TemplateEnsurer | None = None
    policy: PolicyStore | None = None

    def stop(self) -> None:
        for stop in self.stoppers:
            stop()


def gc_leader(runtime_dir: str | None) -> Callable[[], bool]:
    """True in exactly one worker of this pod: the one holding an exclusive lock on a file.

    The lock is held for the life of the process and released by the kernel when it dies, so
    another worker takes over at its next try. Replicas need no coordination (see templates).
    """
    if not runtime_dir:
        return lambda: True
    path = Path(runtime_dir) / "template-gc.lock"
    handle: list[IO[bytes]] = []

    def may_run() -> bool:
        if handle:
            return True
        file = open(path, "ab")  # held open on purpose while leading
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            file.close()
            return False
        handle.append(file)
        return True

    return may_run


def build_runtime(config: ServerConfig, *, api: KubeApi | None = None) -> Runtime:
    """A started runtime. ``api`` overrides the client built from ``config`` (tests)."""
    from gpu_slicer.webhook.metrics import (
        Metrics,  # imported late: after PROMETHEUS_MULTIPROC_DIR is set
    )

    metrics = Metrics(certificate=config.tls_cert)
    reporter = Reporter(metrics)
    sources: list[ExtendedResourceNames | StaticExtendedNames] = []

    def report_extended(reason: str, *, force: bool = False) -> None:
        """Which DeviceClasses claim which extended resources, and what that makes the webhook
        do (webhook.extended): at start-up, on every policy reload, when the classes change."""
        if sources and store.loaded and sources[0].synced:
            reporter.update(store.current(), sources[0].classes(), reason=reason, force=force)

    def reloaded(result: str) -> None:
        metrics.policy_reloads.labels(result=result).inc()
        if result == "loaded":
            report_extended("policy reloaded", force=True)

    store = PolicyStore(config.policy, check_interval_s=config.policy_check_s, on_reload=reloaded)
    store.start()

    def gc_after() -> int:
        return store.current().template_gc_after_s if store.loaded else 0

    def count(action: str) -> None:
        metrics.count(metrics.templates, action)

    stoppers: list[Callable[[], None]] = [store.stop]
    templates: TemplateEnsurer
    modes: NamespaceModes | StaticNamespaceModes
    native: ExtendedResourceNames | StaticExtendedNames
    quotas: NamespaceQuotas | StaticQuotas
    if config.dev and api is None:
        modes = StaticNamespaceModes(config.effective_namespace_mode)
        native = StaticExtendedNames()
        quotas = StaticQuotas()
        sources.append(native)
        report_extended("start-up", force=True)
        templates = ReportingTemplates(on_action=count)
    else:
        modes, native, quotas, templates = _cluster_sources(
            config,
            api,
            sources=sources,
            on_classes=lambda: report_extended("DeviceClasses listed or changed"),
            gc_after=gc_after,
            count=count,
            stoppers=stoppers,
        )

    def policy_now() -> Policy:
        return store.current()

    engine = AdmissionEngine(
        policy=policy_now,
        mode_for_namespace=modes.mode,
        native_extended=native.names,
        templates=templates,
        quota_for_namespace=quotas.quota,
    )

    return Runtime(
        reviewer=engine,
        metrics=metrics,
        readiness=functools.partial(_readiness, store, modes, native, quotas),
        stoppers=stoppers,
        templates=templates,
        policy=store,
    )


def _readiness(
    store: PolicyStore,
    modes: NamespaceModes | StaticNamespaceModes,
    native: ExtendedResourceNames | StaticExtendedNames,
    quotas: NamespaceQuotas | StaticQuotas,
) -> list[str]:
    """Why the server cannot answer reviews yet; [] once policy and caches are in."""
    problems: list[str] = []
    if not store.loaded:
        problems.append(f"no valid policy loaded: {store.last_error or 'not read yet'}")
    if not modes.synced:
        problems.append("the Namespace cache has not synced yet")
    if not native.synced:
        problems.append("the DeviceClass cache has not synced yet")
    if not quotas.synced:
        problems.append("the ResourceQuota cache has not synced yet")
    return problems


def _cluster_sources(
    config: ServerConfig,
    api: KubeApi | None,
    *,
    sources: list[ExtendedResourceNames | StaticExtendedNames],
    on_classes: Callable[[], None],
    gc_after: Callable[[], int],
    count: Callable[[str], None],
    stoppers: list[Callable[[], None]],
) -> tuple[NamespaceModes, ExtendedResourceNames, NamespaceQuotas, ApiTemplates]:
    """The started caches, template ensurer and collector of a server with a cluster. The
    DeviceClass cache joins ``sources`` before it starts, so its first listing is reported;
    what has to be stopped joins ``stoppers``."""
    if api is None:
        from gpu_slicer.kube.client import RealKubeApi

        api = RealKubeApi.from_config(config.kubeconfig)
    modes = NamespaceModes(api)
    native = ExtendedResourceNames(api, on_change=on_classes)
    quotas = NamespaceQuotas(api)
    sources.append(native)
    modes.start()
    native.start()
    quotas.start()
    stoppers += [modes.stop, native.stop, quotas.stop]
    templates = ApiTemplates(
        api, ttl_s=config.template_cache_ttl_s, gc_after_s=gc_after, on_action=count
    )
    loop = CollectorLoop(
        TemplateCollector(api, gc_after_s=gc_after, forget=templates.forget, on_action=count),
        interval_s=config.gc_interval_s,
        may_run=gc_leader(config.runtime_dir),
    )
    loop.start()
    stoppers.append(loop.stop)
    return modes, native, quotas, templates


# ----------------------------------------------------------------------------- dev certificate


def make_dev_certificate(
    directory: str | os.PathLike[str], hosts: list[str], *, days: int = 7
) -> tuple[Path, Path]:
    """A self-signed serving certificate for ``hosts`` (names or IPs): (cert path, key path)."""
    from gpu_slicer.certs.files import CERT_MODE, KEY_MODE, write_cert_file
    from gpu_slicer.certs.issue import self_signed

    pair = self_signed(hosts, common_name="gpu-slicer-webhook-dev", days=days)
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / "dev-tls.crt", folder / "dev-tls.key"
    write_cert_file(cert_path, pair.cert_pem, mode=CERT_MODE)
    write_cert_file(key_path, pair.key_pem, mode=KEY_MODE)
    return cert_path, key_path


# ----------------------------------------------------------------------------- serve


def prepare(config: ServerConfig) -> ServerConfig:
    """Checks settings and policy (ConfigError / PolicyError), makes the runtime folder and the
    dev certificate, and writes the result to the environment that gunicorn workers inherit."""
    config.check()
    if config.policy:
        load_policy_file(config.policy)  # refuse to start on a bad policy: exit 2 upstream
    if not config.dev:
        from gpu_slicer.kube.client import RealKubeApi
        from gpu_slicer.kube.errors import KubeError

        try:  # fail here, once, rather than in every worker as it boots
            RealKubeApi.from_config(config.kubeconfig)
        except KubeError as exc:
            raise ConfigError([str(exc)]) from exc
    config = config.with_runtime_folders()
    runtime_dir = str(config.runtime_dir)
    if config.dev and not (config.tls_cert and config.tls_key):
        host, _port = config.host_port()
        hosts = ["localhost", "127.0.0.1", "::1"] + (
            [host] if host not in ("", "0.0.0.0", "::") else []
        )
        cert, key = make_dev_certificate(runtime_dir, hosts)
        config = replace(config, tls_cert=str(cert), tls_key=str(key))
        log.info(
            "dev mode: self-signed certificate; trust it with --cacert",
            extra={"cert": str(cert), "namespace_mode": config.effective_namespace_mode},
        )
    if config.tls_cert and config.tls_key:
        import ssl

        from gpu_slicer.certs.reload import server_context

        try:  # a missing or mismatched pair would otherwise fail every handshake
            server_context(config.tls_cert, config.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                [f"--tls-cert {config.tls_cert} / --tls-key {config.tls_key}: cannot load: {exc}"]
            ) from exc
        if config.client_ca:
            try:
                server_context(config.tls_cert, config.tls_key, client_ca=config.client_ca)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(
                    [f"--client-ca {config.client_ca}: cannot load a CA bundle from it: {exc}"]
                ) from exc
    os.environ.update(config.to_env())  # the dev certificate's paths too
    return config


def check_bind(config: ServerConfig) -> None:
    """ConfigError naming ``--bind`` when its address cannot be listened on (a port in use, an
    address not on this host): gunicorn would retry and then log five lines per attempt."""
    host, port = config.host_port()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            reason = (
                "the port is already in use"
                if exc.errno == errno.EADDRINUSE
                else exc.strerror or str(exc)
            )
            raise ConfigError(
                [
                    f"--bind {config.bind}: cannot listen there: {reason}; choose another with "
                    "--bind HOST:PORT"
                ]
            ) from exc


def _remove_dev_files(config: ServerConfig, created_runtime_dir: bool) -> None:
    """After ``--dev``: the runtime folder this run made (with the dev key), or else the dev
    certificate and key it wrote into the folder it was given."""
    if not (config.dev and config.runtime_dir):
        return
    folder = Path(config.runtime_dir)
    if created_runtime_dir:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for name in ("dev-tls.crt", "dev-tls.key"):
        if config.tls_cert == str(folder / name) or config.tls_key == str(folder / name):
            (folder / name).unlink(missing_ok=True)


def serve(config: ServerConfig) -> int:
    """Runs gunicorn until it stops; returns its exit code. ``--dev`` leaves nothing behind."""
    check_bind(config.check())
    if config.policy:
        load_policy_file(config.policy)  # bad input is refused before the process is patched
    _patch_for_gevent()
    created_runtime_dir = config.runtime_dir is None
    config = prepare(config)
    try:
        return _run_gunicorn()
    finally:
        _remove_dev_files(config, created_runtime_dir)


def _patch_for_gevent() -> None:
    """The workers are gevent's: ssl must be patched before anything imports it.

    Otherwise urllib3 (through the Kubernetes client, imported by :func:`prepare` to check the
    credentials) keeps the unpatched ``SSLContext`` and every TLS call a worker makes to the
    apiserver recurses until it fails (gevent issue 1016). Patching here, in the gunicorn master,
    covers the workers it forks; no gpu-slicer command imports ssl while its parser is built.
    """
    from gevent import monkey

    monkey.patch_all()


def _run_gunicorn() -> int:
    from gunicorn.app.base import Application

    class WebhookServer(Application):  # type: ignore[misc]
        def init(self, parser: Any, opts: Any, args: Any) -> None:
            return None

        def load_config(self) -> None:
            for key, value in self.get_config_from_filename(str(GUNICORN_CONF)).items():
                if key in self.cfg.settings and value is not None:
                    self.cfg.set(key.lower(), value)

        def load(self) -> Any:
            from gpu_slicer.webhook.app import create_app

            return create_app()

    try:
        WebhookServer().run()
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    return 0
