"""Prometheus metrics of the admission server, correct with several gunicorn workers.

Each gunicorn worker is its own process with its own counters. With ``PROMETHEUS_MULTIPROC_DIR``
set (``gunicorn.conf.py`` sets it before any worker starts) prometheus-client writes every value
to a memory-mapped file in that folder, and ``/metrics`` in any worker sums the files of all of
them; the ``child_exit`` hook marks a dead worker so its live-only values are dropped. Without the
variable (tests, a single process) the metrics are ordinary in-process values.

The metric objects live in a registry of their own rather than the global one, so that tests can
build as many apps as they like in one process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import generate_latest as _generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpu_slicer.webhook.config import MULTIPROC_ENV

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
"""Seconds. Admission must stay in milliseconds; the top buckets catch API stalls."""


CERTIFICATE_EXPIRY = "gpu_slicer_webhook_certificate_expiry_timestamp_seconds"


class CertificateExpiry(Collector):
    """The serving certificate's notAfter, read from its file at every scrape.

    Read at scrape time rather than kept as a gauge: the file is renewed underneath the running
    server (certs ensure, cert-manager, service-ca), and a gauge would need every gunicorn
    worker to notice. An unreadable file yields no sample, which the expiry alert treats as
    absent rather than as expired.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            CERTIFICATE_EXPIRY,
            "Unix time at which the webhook's serving certificate (--tls-cert) expires.",
        )
        not_after = _not_after(self.path)
        if not_after is not None:
            family.add_metric([], not_after)
        yield family


def _not_after(path: Path) -> float | None:
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return None
    return cert.not_valid_after_utc.timestamp()


class Metrics:
    """The webhook's counters and histogram; ``exposition()`` renders them for ``/metrics``.

    ``certificate``: the serving certificate file whose expiry ``/metrics`` reports.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, certificate: str | Path | None = None
    ) -> None:
        _use_multiprocess_values_if_configured()
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self._children: dict[tuple[Counter, tuple[str, ...]], Counter] = {}
        self.certificate = CertificateExpiry(certificate) if certificate else None
        if self.certificate is not None:
            self.registry.register(self.certificate)
        self.requests = Counter(
            "gpu_slicer_webhook_requests",
            "Admission requests by outcome (patched, unchanged, audited, would-deny, denied, "
            "skipped, "
            "bad_request, unsupported_media_type, too_large, error) and namespace mode.",
            ["outcome", "mode"],
            registry=self.registry,
        )
        self.conversions = Counter(
            "gpu_slicer_webhook_conversions",
            "Legacy requests converted (mode enabled) or that would be converted (mode audit), "
            "by legacy resource.",
            ["resource", "mode"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gpu_slicer_webhook_request_duration_seconds",
            "Time to answer POST /mutate-pods, from the request to the response.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.templates = Counter(
            "gpu_slicer_webhook_templates",
            "ResourceClaimTemplate operations by action (created, existed, refreshed, reported, "
            "deleted, failed).",
            ["action"],
            registry=self.registry,
        )
        self.extended_classes = Gauge(
            "gpu_slicer_webhook_extended_resource_classes",
            "1 per extended resource a DeviceClass claims (KEP-5004): the class the scheduler "
            "serves it from and how the webhook handles such pods (defer, convert, "
            "not-a-gpu-resource); 0 once that no longer holds.",
            ["resource", "device_class", "handling"],
            multiprocess_mode="livemax",
            registry=self.registry,
        )
        self.deferred = Counter(
            "gpu_slicer_webhook_deferred",
            "Legacy requests left unconverted because a DeviceClass serves them "
            "(nativeExtendedResources: defer), by resource and namespace mode.",
            ["resource", "mode"],
            registry=self.registry,
        )
        self.policy_reloads = Counter(
            "gpu_slicer_webhook_policy_reloads",
            "Policy file reloads by result (loaded, refused).",
            ["result"],
            registry=self.registry,
        )

    def count(self, counter: Counter, *values: str) -> None:
        """``counter.labels(*values).inc()``, with the labelled child remembered here.

        Every admission counts one or more labelled samples, and ``labels()`` checks its
        arguments, converts them to str and takes the metric's lock to find a child it has
        already made. The child of a given label set never changes (nothing here removes one),
        so the one ``labels()`` returned is kept in a dict and incremented directly: the same
        sample, the same value, a fraction of the work. ``values`` are in the metric's label
        order.
        """
        key = (counter, values)
        child = self._children.get(key)
        if child is None:
            child = self._children.setdefault(key, counter.labels(*values))
        child.inc()

    def exposition(self) -> tuple[bytes, str]:
        """(body, content type) of the text exposition, summed over all workers if multiprocess."""
        if os.environ.get(MULTIPROC_ENV):
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            if self.certificate is not None:
                registry.register(self.certificate)
            return _generate_latest(registry), CONTENT_TYPE_LATEST
        return _generate_latest(self.registry), CONTENT_TYPE_LATEST


def _use_multiprocess_values_if_configured() -> None:
    """prometheus-client picks its value class when first imported; if that happened before
    ``PROMETHEUS_MULTIPROC_DIR`` was set (the master imported it early), pick again so this
    process writes the shared files instead of keeping private values nobody can scrape."""
    from prometheus_client import values

    if os.environ.get(MULTIPROC_ENV) and values.ValueClass is values.MutexValue:
        values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]


def mark_process_dead(pid: int) -> None:
    """For gunicorn's ``child_exit`` hook: forget the live values of a dead worker."""
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
