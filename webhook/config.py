"""How the admission server is configured: one dataclass, filled from a file, env and flags
as every long-running command is (:mod:`kube.settings`).

Precedence, lowest first: defaults, a YAML file (``--config`` / ``GPU_SLICER_CONFIG``), the
environment, command-line flags. Every setting has an environment twin ``GPU_SLICER_<NAME>``:
gunicorn workers are separate processes that read their settings from the environment, so
``webhook serve`` writes the merged configuration there (:meth:`ServerConfig.to_env`) before it
starts gunicorn, and ``gunicorn.conf.py`` and ``create_app()`` read it back
(:meth:`ServerConfig.from_env`).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from gpu_slicer.core.identity import NamespaceMode
from gpu_slicer.kube.settings import Settings, SettingsError
from gpu_slicer.webhook.errors import WebhookError

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus-client's folder for the workers' per-process files, read when it is first
imported: set before any worker imports it."""

MAX_BODY_BYTES = 3 * 1024 * 1024
"""The apiserver never sends more; anything larger is not an AdmissionReview (HTTP 413)."""


class ConfigError(WebhookError, SettingsError):
    """The server's settings are inconsistent; ``problems`` name the flag or variable."""


@dataclass(frozen=True)
class ServerConfig(Settings):
    """Settings of ``gpu-slicer webhook serve``; field ``x_y`` is flag ``--x-y``, env ``X_Y``."""

    error: ClassVar[type[SettingsError]] = ConfigError
    config_setting: ClassVar[str | None] = "config"

    bind: str = "0.0.0.0:8443"
    tls_cert: str | None = None
    tls_key: str | None = None
    dev: bool = False
    policy: str | None = None
    workers: int = 2
    connections: int = 1000
    """Connections one worker serves at a time (each a greenlet); more wait in the backlog."""
    read_timeout_s: float = 3.0
    """How long a connection may take to deliver its TLS handshake and a whole request (a
    kept-alive one: from the request's first byte) before it is closed. Keep it under the
    webhook configuration's ``timeoutSeconds`` (5 in deploy/), so that a stalled client is gone
    before the apiserver would give up on a real review."""
    client_ca: str | None = None
    """A CA bundle: when set, clients must present a certificate it signed (mutual TLS; the
    apiserver presents one when its admission configuration gives it one for this webhook)."""
    kubeconfig: str | None = None
    namespace_mode: NamespaceMode | None = None
    """Only with ``dev``: the mode of every namespace (there is no cluster to read labels from)."""
    policy_check_s: float = 5.0
    """How often the policy file is checked for a new version."""
    tls_check_s: float = 5.0
    """How often the certificate files are checked for a rotation."""
    template_cache_ttl_s: float = 600.0
    """How long a template known to exist is trusted without asking the API again."""
    gc_interval_s: float = 600.0
    """How often unused managed templates are looked for; 0 turns garbage collection off."""
    log_level: str = "INFO"
    runtime_dir: str | None = None
    """Where workers share lock files and metrics; a fresh temporary folder when None."""

    def with_runtime_folders(self) -> ServerConfig:
        """This configuration with its runtime folder made (a fresh one when unset) and the
        multiprocess metrics folder in it, both written to the environment the gunicorn
        workers inherit. ``webhook serve`` and ``gunicorn.conf.py`` (a container's plain
        gunicorn command) both call it; it is idempotent."""
        runtime_dir = self.runtime_dir or tempfile.mkdtemp(prefix="gpu-slicer-webhook-")
        config = replace(self, runtime_dir=runtime_dir)
        os.environ.update(config.to_env())
        os.environ.setdefault(MULTIPROC_ENV, str(Path(runtime_dir) / "metrics"))
        Path(os.environ[MULTIPROC_ENV]).mkdir(parents=True, exist_ok=True)
        return config

    # ------------------------------------------------------------------ derived
    @property
    def create_templates(self) -> bool:
        """Whether templates are really created (not in ``dev``: there is no cluster)."""
        return not self.dev

    @property
    def effective_namespace_mode(self) -> NamespaceMode:
        return self.namespace_mode or "enabled"

    def host_port(self) -> tuple[str, int]:
        host, _, port = self.bind.rpartition(":")
        return host.strip("[]"), int(port)

    # ------------------------------------------------------------------ checks
    def problems(self) -> list[str]:
        """What is wrong with these settings, each naming the flag; [] when usable."""
        found = self._bind_problems() + self._tls_problems()
        if not self.dev and self.namespace_mode is not None:
            found.append(
                "--namespace-mode only applies with --dev; in a cluster each namespace's "
                "mode comes from its label gpu-slicer.io/migration"
            )
        if self.namespace_mode not in (None, "enabled", "audit"):
            found.append(f"--namespace-mode {self.namespace_mode!r}: use enabled or audit")
        if self.workers < 1:
            found.append(f"--workers {self.workers}: at least 1")
        if self.connections < 1:
            found.append(f"--connections {self.connections}: at least 1")
        if not 0 < self.read_timeout_s <= 30:
            found.append(
                f"--read-timeout-s {self.read_timeout_s}: between 0 and 30 seconds (the longest "
                "webhook timeoutSeconds), and under the webhook's own timeoutSeconds"
            )
        for name in ("policy_check_s", "tls_check_s", "template_cache_ttl_s", "gc_interval_s"):
            if getattr(self, name) < 0:
                found.append(f"--{name.replace('_', '-')} must not be negative")
        return found

    def _bind_problems(self) -> list[str]:
        host, sep, port = self.bind.rpartition(":")
        if not sep or not host or not port.isdigit():
            return [f"--bind {self.bind!r}: expected HOST:PORT, e.g. 0.0.0.0:8443"]
        if not 0 <= int(port) <= 65535:
            return [f"--bind {self.bind!r}: port {port} is out of range (0-65535)"]
        return []

    def _tls_problems(self) -> list[str]:
        """Only ``--dev`` may do without a certificate: the apiserver calls webhooks over TLS."""
        found: list[str] = []
        if bool(self.tls_cert) != bool(self.tls_key):
            found.append("give both --tls-cert and --tls-key, or neither (with --dev)")
        if not self.dev and not (self.tls_cert or self.tls_key):
            found.append(
                "give --tls-cert and --tls-key (the apiserver only calls webhooks over "
                "TLS), or --dev for a local self-signed server"
            )
        return found
