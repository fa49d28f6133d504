"""The serving certificate's expiry on /metrics: the number the expiry alert watches."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from gpu_slicer.certs.issue import self_signed
from gpu_slicer.webhook.metrics import CERTIFICATE_EXPIRY, Metrics


def _write_cert(path: Path, days: int) -> float:
    now = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    pair = self_signed(["gpu-slicer-webhook.gpu-slicer.svc"], common_name="t", days=days, now=now)
    path.write_bytes(pair.cert_pem)
    return pair.cert.not_valid_after_utc.timestamp()


def test_metrics_report_the_certificate_files_not_after_and_follow_a_renewal(
    tmp_path: Path,
) -> None:
    cert = tmp_path / "tls.crt"
    first = _write_cert(cert, days=30)
    metrics = Metrics(certificate=cert)
    assert metrics.registry.get_sample_value(CERTIFICATE_EXPIRY) == first
    renewed = _write_cert(cert, days=90)
    assert renewed > first
    assert metrics.registry.get_sample_value(CERTIFICATE_EXPIRY) == renewed
    body, _ = metrics.exposition()
    assert CERTIFICATE_EXPIRY.encode() in body


def test_an_unreadable_certificate_gives_no_sample_rather_than_a_false_expiry(
    tmp_path: Path,
) -> None:
    cert = tmp_path / "tls.crt"
    cert.write_text("not a certificate")
    metrics = Metrics(certificate=cert)
    assert metrics.registry.get_sample_value(CERTIFICATE_EXPIRY) is None
    assert Metrics().registry.get_sample_value(CERTIFICATE_EXPIRY) is None
