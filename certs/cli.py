"""Subcommands of the certs package: ``certs issue`` (files) and ``certs ensure`` (in cluster)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from gpu_slicer.certs import ensure as certs_ensure
from gpu_slicer.certs import issue as certs_issue
from gpu_slicer.certs.errors import CertError, CertInputError, EnsureError
from gpu_slicer.kube import documents
from gpu_slicer.kube.api import KubeApi, connect
from gpu_slicer.kube.errors import KubeError
from gpu_slicer.kube.names import subdomain_problem
from gpu_slicer.kube.settings import env_value


def _env_or_required(name: str) -> dict[str, Any]:
    """``add_argument`` keywords for a flag that is required unless its env twin is set (every
    flag has one, :mod:`kube.settings`: ``--renew-before`` is ``GPU_SLICER_RENEW_BEFORE``)."""
    value = env_value(name)
    return {"default": value, "required": value is None}


MAX_DAYS = 36_500
"""Certificate lifetimes (and renewal margins) past this overflow the dates X.509 can hold."""
MAX_WAIT = 10_000_000.0
"""Seconds (--interval) or hours (--rotation-grace) beyond this overflow the timers."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    if value > MAX_DAYS:
        raise argparse.ArgumentTypeError(
            f"{value} days is past what a certificate can say (at most {MAX_DAYS}, 100 years)"
        )
    return value


def _folder(text: str) -> Path:
    """A folder path; an empty one (an unset shell variable) would silently mean the cwd."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; name the folder for the files")
    return Path(text)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be more than 0 seconds")
    if value > MAX_WAIT:
        raise argparse.ArgumentTypeError(f"{text} is more than {MAX_WAIT:,.0f}")
    return value


def _add_lifetimes(parser: argparse.ArgumentParser, *, days: str) -> None:
    """``--days`` (the serving certificate, default ``days``) and ``--ca-days`` (3650)."""
    parser.add_argument(
        "--days",
        type=_positive_int,
        default=env_value("DAYS", days),
        help=f"serving certificate lifetime in days (default {days})",
    )
    parser.add_argument(
        "--ca-days",
        type=_positive_int,
        default=env_value("CA_DAYS", "3650"),
        help="CA lifetime in days (default 3650)",
    )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    certs = subparsers.add_parser(
        "certs", help="webhook serving certificates: issue files, or keep them current in cluster"
    )
    sub = certs.add_subparsers(dest="certs_command", metavar="ACTION", required=True)

    p = sub.add_parser(
        "issue",
        help="write a new CA and a serving certificate (ca.crt, tls.crt, tls.key) to a folder",
        description="Creates a CA and a serving certificate for SERVICE.NAMESPACE.svc (ECDSA"
        " P-256, server-auth) and writes ca.crt, tls.crt and tls.key (0600) into --out,"
        " replacing any previous set at once. The CA key is not kept.",
    )
    p.add_argument(
        "--service",
        **_env_or_required("SERVICE"),
        help="the webhook Service's name (env GPU_SLICER_SERVICE)",
    )
    p.add_argument(
        "--namespace",
        **_env_or_required("NAMESPACE"),
        help="the webhook's namespace (env GPU_SLICER_NAMESPACE)",
    )
    p.add_argument(
        "--out",
        **_env_or_required("OUT"),
        type=_folder,
        help="folder for the files, created if missing (env GPU_SLICER_OUT)",
    )
    p.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="NAME",
        help="a further DNS name or IP the certificate covers, for an apiserver that"
        " reaches the webhook by URL (repeatable)",
    )
    _add_lifetimes(p, days="365")
    p.set_defaults(func=run_issue)
    _register_ensure(sub)


def _register_ensure(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    e = sub.add_parser(
        "ensure",
        help="create or renew the webhook's TLS Secret and caBundle in the cluster (idempotent)",
        description="Keeps Secret NAME (tls.crt, tls.key, ca.crt) and NAME-ca (the CA) current"
        " and sets the caBundle of every webhook in the MutatingWebhookConfiguration, keeping the"
        " old CA beside the new one while a CA rotates. With --interval it runs until stopped.",
    )
    e.add_argument(
        "--namespace",
        **_env_or_required("NAMESPACE"),
        help="namespace of the Secrets and the Service (env GPU_SLICER_NAMESPACE)",
    )
    e.add_argument(
        "--secret",
        **_env_or_required("SECRET"),
        help="the serving Secret's name (env GPU_SLICER_SECRET)",
    )
    e.add_argument(
        "--webhook-config",
        **_env_or_required("WEBHOOK_CONFIG"),
        help="the MutatingWebhookConfiguration's name (env GPU_SLICER_WEBHOOK_CONFIG)",
    )
    e.add_argument(
        "--service",
        default=env_value("SERVICE", "gpu-slicer-webhook"),
        help="the webhook Service's name (default gpu-slicer-webhook)",
    )
    e.add_argument(
        "--kubeconfig",
        default=env_value("KUBECONFIG"),
        help="kubeconfig file (default: in-cluster account, then ~/.kube/config)",
    )
    e.add_argument(
        "--interval",
        type=_positive_float,
        default=env_value("INTERVAL"),
        metavar="SECONDS",
        help="run again every SECONDS until stopped (default: once)",
    )
    e.add_argument(
        "--renew-before",
        type=_positive_int,
        default=env_value("RENEW_BEFORE", "30"),
        metavar="DAYS",
        help="renew the serving certificate this many days before it expires (30)",
    )
    _add_lifetimes(e, days="90")
    e.add_argument(
        "--rotation-grace",
        type=_positive_float,
        default=env_value("ROTATION_GRACE", "24"),
        metavar="HOURS",
        help="keep a replaced CA in the caBundle this long after a new leaf (24)",
    )
    e.set_defaults(func=run_ensure)


def run_issue(args: argparse.Namespace) -> int:
    if args.out.exists() and not args.out.is_dir():
        print(f"gpu-slicer certs issue: --out {args.out} is a file, not a folder", file=sys.stderr)
        return 2
    try:
        issued = certs_issue.issue(
            service=args.service,
            namespace=args.namespace,
            days=args.days,
            ca_days=args.ca_days,
            extra_hosts=args.host,
        )
        paths = certs_issue.write_files(issued, args.out)
    except CertInputError as exc:
        print(f"gpu-slicer certs issue: {exc}", file=sys.stderr)
        return 2
    except CertError as exc:
        print(f"gpu-slicer certs issue: {exc}", file=sys.stderr)
        return 1
    names = certs_issue.dns_names(issued.serving.cert)
    print(
        json.dumps(
            {
                "files": [str(p) for p in paths],
                "dnsNames": names,
                "ipAddresses": certs_issue.ip_addresses(issued.serving.cert),
                "notAfter": issued.serving.cert.not_valid_after_utc.isoformat(),
                "caNotAfter": issued.ca.cert.not_valid_after_utc.isoformat(),
                "caFingerprintSHA256": certs_issue.fingerprint(issued.ca.cert),
            }
        )
    )
    return 0


def settings_from(args: argparse.Namespace) -> certs_ensure.EnsureSettings:
    return certs_ensure.EnsureSettings(
        namespace=args.namespace,
        secret=args.secret,
        webhook_config=args.webhook_config,
        service=args.service,
        days=args.days,
        ca_days=args.ca_days,
        renew_before=dt.timedelta(days=args.renew_before),
        rotation_grace=dt.timedelta(hours=args.rotation_grace),
    )


def _summary(result: certs_ensure.EnsureResult) -> str:
    return json.dumps(
        {
            "caCreated": result.ca_created,
            "caReason": result.ca_reason,
            "leafIssued": result.leaf_issued,
            "leafReason": result.leaf_reason,
            "bundlePatched": result.bundle_patched,
            "caBundleSHA256": result.bundle,
            "leafNotAfter": result.leaf_not_after.isoformat() if result.leaf_not_after else None,
        }
    )


def run_ensure(
    args: argparse.Namespace, *, api_factory: Callable[[str | None], KubeApi] = connect
) -> int:
    try:
        settings = settings_from(args)
        settings.check()
    except CertInputError as exc:
        print(f"gpu-slicer certs ensure: {exc}", file=sys.stderr)
        return 2
    for problem in (
        subdomain_problem("--secret", args.secret, "Secret", suffix="-ca"),
        subdomain_problem("--webhook-config", args.webhook_config, "MutatingWebhookConfiguration"),
    ):
        if problem:
            print(f"gpu-slicer certs ensure: {problem}", file=sys.stderr)
            return 2
    problem = documents.file_problem("--kubeconfig", args.kubeconfig)
    if problem:
        print(f"gpu-slicer certs ensure: {problem}", file=sys.stderr)
        return 2
    try:
        api = api_factory(args.kubeconfig)
    except KubeError as exc:
        print(f"gpu-slicer certs ensure: {exc}", file=sys.stderr)
        return 1
    if args.interval is None:
        try:
            result = certs_ensure.ensure(api, settings)
        except EnsureError as exc:
            print(f"gpu-slicer certs ensure: {exc}", file=sys.stderr)
            return 1
        print(_summary(result))
        return 0

    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)

    def _report(outcome: certs_ensure.EnsureResult | EnsureError) -> None:
        if isinstance(outcome, certs_ensure.EnsureResult):
            print(_summary(outcome), flush=True)

    certs_ensure.run_periodically(
        api, settings, interval_s=args.interval, stop=stop, on_result=_report
    )
    return 0
