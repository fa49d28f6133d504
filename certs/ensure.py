"""``certs ensure``: keep the webhook's serving Secret and the caBundle current, in the cluster.

Idempotent: run it at install time and then periodically; a run with nothing to do only reads.
State lives in the cluster, nowhere else:

- Secret ``<secret>-ca`` (type ``kubernetes.io/tls``): the CA certificate and key. Only this
  command reads it; the webhook pods never mount it.
- Secret ``<secret>`` (type ``kubernetes.io/tls``): ``tls.crt``, ``tls.key``, ``ca.crt`` for the
  webhook pods, which mount it; the kubelet swaps the files atomically and the webhook reloads
  them without a restart.
- ``clientConfig.caBundle`` of every webhook in the MutatingWebhookConfiguration.

One run:

1. Read the three objects.
2. Keep the CA unless it is missing, unreadable, or will expire before a new leaf would
   (``ca remaining < days + renew_before``); then make a new one and store it first, so that a
   crash later in the run never leaves a caBundle naming a CA whose key is lost.
3. Decide the leaf: keep it unless it is missing, unreadable, not signed by the current CA, not
   for the right names, or inside its renewal window (``not_after - now <= renew_before``).
4. Patch each webhook's caBundle to: the current CA, plus every other CA certificate already in
   the bundle that has not expired, for as long as the newest leaf is younger than
   ``rotation_grace``. This is the rotation overlap: the apiserver trusts old and new CA until
   every webhook pod serves the new leaf. The patch carries ``metadata.resourceVersion``, so a
   concurrent writer makes it fail with Conflict instead of losing an update.
5. Only then write the new leaf into the serving Secret (the bundle already trusts its CA).

Writes conflict (another replica, another run): the run starts over from step 1, a few times.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509

from gpu_slicer.certs import issue as certs_issue
from gpu_slicer.certs.errors import CertDataError, CertInputError, EnsureError
from gpu_slicer.certs.issue import KeyPair
from gpu_slicer.core.identity import MANAGED_BY, MANAGED_BY_LABEL
from gpu_slicer.kube import errors as kube_errors
from gpu_slicer.kube.api import KubeApi, Obj

log = logging.getLogger(__name__)

SECRET_API = ("v1", "Secret")
WEBHOOK_CONFIG_API = ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration")
TLS_SECRET_TYPE = "kubernetes.io/tls"
MANAGED_LABELS = {
    "app.kubernetes.io/name": "gpu-slicer",
    "app.kubernetes.io/component": "webhook-certificates",
    MANAGED_BY_LABEL: MANAGED_BY,
}
ATTEMPTS = 5


@dataclass(frozen=True)
class EnsureSettings:
    """What to keep current, and the lifetimes. Durations are days (``timedelta`` for windows)."""

    namespace: str
    secret: str
    webhook_config: str
    service: str = "gpu-slicer-webhook"
    days: int = 90
    ca_days: int = 3650
    renew_before: dt.timedelta = dt.timedelta(days=30)
    rotation_grace: dt.timedelta = dt.timedelta(days=1)

    @property
    def ca_secret(self) -> str:
        return f"{self.secret}-ca"

    def check(self) -> None:
        """Raises CertInputError for settings that can never work (bad names, bad windows)."""
        certs_issue.check_names(self.service, self.namespace)
        if self.days < 1 or self.ca_days < 1:
            raise CertInputError("--days and --ca-days must be at least 1")
        if self.renew_before >= dt.timedelta(days=self.days):
            raise CertInputError(
                f"--renew-before ({self.renew_before.days} days) must be shorter than --days"
                f" ({self.days}): otherwise every run would issue a new certificate"
            )
        if self.ca_days < self.days + self.renew_before.days:
            raise CertInputError(
                f"--ca-days ({self.ca_days}) must be at least --days + --renew-before"
                f" ({self.days + self.renew_before.days}) so that a CA outlives its leaves"
            )


@dataclass
class EnsureResult:
    """What one run did; ``changed`` is False for a run that only read."""

    ca_created: bool = False
    ca_reason: str = ""
    leaf_issued: bool = False
    leaf_reason: str = ""
    bundle_patched: bool = False
    bundle: list[str] = field(default_factory=list)  # fingerprints, current CA first
    leaf_not_after: dt.datetime | None = None
    webhook_config_missing: bool = False

    @property
    def changed(self) -> bool:
        return self.ca_created or self.leaf_issued or self.bundle_patched


class _Restart(Exception):
    """Someone else wrote first: read again and redo the run."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _secret_bytes(secret: Obj | None, key: str) -> bytes | None:
    if secret is None:
        return None
    value = (secret.get("data") or {}).get(key)
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


def _get(api: KubeApi, kind_api: tuple[str, str], name: str, ns: str | None) -> Obj | None:
    try:
        return api.get(*kind_api, name, ns)
    except kube_errors.NotFound:
        return None


def _load_pair(secret: Obj | None) -> KeyPair | None:
    cert_pem = _secret_bytes(secret, certs_issue.CERT_FILE)
    key_pem = _secret_bytes(secret, certs_issue.KEY_FILE)
    if cert_pem is None or key_pem is None:
        return None
    try:
        cert = certs_issue.load_certificate(cert_pem)
        key = certs_issue.load_key(key_pem)
    except CertDataError:
        return None
    if not certs_issue.key_matches(cert, key):
        return None
    return KeyPair(cert, key)


def ca_problem(ca: KeyPair | None, settings: EnsureSettings, now: dt.datetime) -> str:
    """Why the CA must be replaced, or "" to keep it."""
    if ca is None:
        return "no readable CA"
    if not certs_issue.is_ca(ca.cert):
        return "the stored CA certificate is not a CA"
    remaining = ca.cert.not_valid_after_utc - now
    if remaining < dt.timedelta(days=settings.days) + settings.renew_before:
        return f"the CA expires in {remaining.days} days, sooner than a new leaf would"
    return ""


def leaf_problem(
    leaf: KeyPair | None,
    ca: KeyPair,
    stored_ca_pem: bytes | None,
    settings: EnsureSettings,
    now: dt.datetime,
) -> str:
    """Why the serving certificate must be reissued, or "" to keep it."""
    if leaf is None:
        return "no readable serving certificate"
    if not certs_issue.is_signed_by(leaf.cert, ca.cert):
        return "the serving certificate is not signed by the current CA"
    if not certs_issue.covers(
        leaf.cert, certs_issue.serving_names(settings.service, settings.namespace)
    ):
        return "the serving certificate does not name the webhook Service"
    remaining = leaf.cert.not_valid_after_utc - now
    if remaining <= settings.renew_before:
        return (
            f"the serving certificate expires in {remaining.days} days, inside the renewal"
            f" window of {settings.renew_before.days} days"
        )
    if stored_ca_pem != ca.cert_pem:
        return "ca.crt in the Secret is not the current CA"
    return ""


def desired_bundle(
    current: bytes,
    ca: x509.Certificate,
    leaf: x509.Certificate,
    settings: EnsureSettings,
    now: dt.datetime,
) -> list[x509.Certificate]:
    """The caBundle to serve: the current CA, plus older CAs while a rotation may be in flight."""
    try:
        existing = certs_issue.load_certificates(current)
    except CertDataError:
        existing = []  # garbage in the bundle trusts nothing; drop it
    wanted = [ca]
    rotating = now < leaf.not_valid_before_utc + settings.rotation_grace
    if rotating:
        seen = {certs_issue.fingerprint(ca)}
        for cert in existing:
            fp = certs_issue.fingerprint(cert)
            if fp in seen or not certs_issue.is_ca(cert) or not certs_issue.is_valid_at(cert, now):
                continue
            seen.add(fp)
            wanted.append(cert)
    return wanted


def _bundle_of(webhook: dict[str, Any]) -> bytes:
    value = (webhook.get("clientConfig") or {}).get("caBundle") or ""
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return b""


def _secret_object(
    settings: EnsureSettings, name: str, data: dict[str, bytes], existing: Obj | None
) -> Obj:
    if existing is not None:
        obj = dict(existing)
        meta = dict(obj.get("metadata") or {})
        labels = dict(meta.get("labels") or {})
        labels.update(MANAGED_LABELS)
        meta["labels"] = labels
        obj["metadata"] = meta
        obj["data"] = {**(existing.get("data") or {}), **{k: _b64(v) for k, v in data.items()}}
        obj.setdefault("type", TLS_SECRET_TYPE)
        return obj
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": dict(MANAGED_LABELS),
        },
        "type": TLS_SECRET_TYPE,
        "data": {k: _b64(v) for k, v in data.items()},
    }


def _write_secret(api: KubeApi, obj: Obj, existing: Obj | None) -> None:
    try:
        if existing is None:
            api.create(obj)
        else:
            api.update(obj)
    except (kube_errors.AlreadyExists, kube_errors.Conflict) as exc:
        raise _Restart(str(exc)) from exc


def _patch_bundle(
    api: KubeApi,
    settings: EnsureSettings,
    config: Obj,
    ca: KeyPair,
    leaf: KeyPair,
    now: dt.datetime,
    result: EnsureResult,
) -> None:
    """Trust the new CA and leaf in every webhook's caBundle before the new leaf is served, so
    the apiserver never meets a certificate it cannot verify."""
    ops: list[Obj] = []
    for index, webhook in enumerate(config.get("webhooks") or []):
        wanted = desired_bundle(_bundle_of(webhook), ca.cert, leaf.cert, settings, now)
        if index == 0:
            result.bundle = [certs_issue.fingerprint(c) for c in wanted]
        pem = certs_issue.bundle_pem(wanted)
        if _bundle_of(webhook) != pem:
            ops.append(
                {"op": "test", "path": f"/webhooks/{index}/name", "value": webhook.get("name")}
            )
            ops.append(
                {
                    "op": "add",
                    "path": f"/webhooks/{index}/clientConfig/caBundle",
                    "value": _b64(pem),
                }
            )
    if ops:
        rv = (config.get("metadata") or {}).get("resourceVersion")
        if rv:
            ops.insert(0, {"op": "replace", "path": "/metadata/resourceVersion", "value": rv})
        try:
            api.patch(*WEBHOOK_CONFIG_API, settings.webhook_config, ops, patch_type="json")
        except (kube_errors.Conflict, kube_errors.Invalid) as exc:
            # Invalid: a failed "test" (webhooks reordered meanwhile); read again.
            raise _Restart(str(exc)) from exc
        result.bundle_patched = True
        log.info("caBundle updated", extra={"bundle": result.bundle})


def _run_once(api: KubeApi, settings: EnsureSettings, now: dt.datetime) -> EnsureResult:
    result = EnsureResult()
    ns = settings.namespace
    ca_secret = _get(api, SECRET_API, settings.ca_secret, ns)
    serving_secret = _get(api, SECRET_API, settings.secret, ns)
    config = _get(api, WEBHOOK_CONFIG_API, settings.webhook_config, None)

    # 2. the CA, stored before anything refers to it
    ca = _load_pair(ca_secret)
    result.ca_reason = ca_problem(ca, settings, now)
    if ca is None or result.ca_reason:
        ca = certs_issue.new_ca(days=settings.ca_days, now=now)
        obj = _secret_object(
            settings,
            settings.ca_secret,
            {certs_issue.CERT_FILE: ca.cert_pem, certs_issue.KEY_FILE: ca.key_pem},
            ca_secret,
        )
        _write_secret(api, obj, ca_secret)
        result.ca_created = True
        log.info(
            "new webhook CA",
            extra={"reason": result.ca_reason, "fingerprint": certs_issue.fingerprint(ca.cert)},
        )

    # 3. the leaf (written in step 5)
    leaf = _load_pair(serving_secret)
    stored_ca = _secret_bytes(serving_secret, certs_issue.CA_FILE)
    result.leaf_reason = leaf_problem(leaf, ca, stored_ca, settings, now)
    new_leaf: KeyPair | None = None
    if leaf is None or result.leaf_reason:
        if leaf is not None and result.leaf_reason.startswith("ca.crt"):
            new_leaf = leaf  # only ca.crt is stale: rewrite it, keep the key
        else:
            new_leaf = certs_issue.new_serving_cert(
                ca, service=settings.service, namespace=ns, days=settings.days, now=now
            )
        leaf = new_leaf
    result.leaf_not_after = leaf.cert.not_valid_after_utc

    # 4. the caBundle, before the new leaf is served
    if config is None:
        result.webhook_config_missing = True
    else:
        _patch_bundle(api, settings, config, ca, leaf, now, result)

    # 5. the serving Secret
    if new_leaf is not None:
        obj = _secret_object(
            settings,
            settings.secret,
            {
                certs_issue.CERT_FILE: new_leaf.cert_pem,
                certs_issue.KEY_FILE: new_leaf.key_pem,
                certs_issue.CA_FILE: ca.cert_pem,
            },
            serving_secret,
        )
        _write_secret(api, obj, serving_secret)
        result.leaf_issued = True
        log.info(
            "serving certificate written",
            extra={"reason": result.leaf_reason, "not_after": str(result.leaf_not_after)},
        )
    return result


def ensure(
    api: KubeApi, settings: EnsureSettings, *, now: dt.datetime | None = None
) -> EnsureResult:
    """Brings the Secrets and the caBundle up to date; see the module docstring for the steps.

    Raises EnsureError when the API refuses or cannot be reached, and when the webhook
    configuration does not exist (after the Secrets were made, so the webhook can start).
    """
    settings.check()
    when = now or certs_issue.utc_now()
    last = ""
    for _ in range(ATTEMPTS):
        try:
            result = _run_once(api, settings, when)
        except _Restart as exc:
            last = str(exc)
            log.info(
                "another writer changed the objects; reading them again", extra={"detail": last}
            )
            continue
        except kube_errors.Forbidden as exc:
            raise EnsureError(
                f"the API refused: {exc}. Grant the ServiceAccount get/create/update on Secrets"
                f" in {settings.namespace} and get/patch on mutatingwebhookconfigurations"
                f" {settings.webhook_config} (deploy/overlays/self-managed has the Role)"
            ) from exc
        except kube_errors.KubeError as exc:
            raise EnsureError(f"the Kubernetes API failed: {exc}") from exc
        if result.webhook_config_missing:
            raise EnsureError(
                f"MutatingWebhookConfiguration {settings.webhook_config!r} not found; the Secrets"
                " are in place, but the caBundle could not be set: apply the webhook"
                " configuration (deploy/) and run again"
            )
        return result
    raise EnsureError(f"gave up after {ATTEMPTS} attempts; other writers kept winning: {last}")


def run_periodically(
    api: KubeApi,
    settings: EnsureSettings,
    *,
    interval_s: float,
    stop: threading.Event,
    retry_s: float = 10.0,
    clock: Callable[[], dt.datetime] = certs_issue.utc_now,
    on_result: Callable[[EnsureResult | EnsureError], None] | None = None,
) -> None:
    """Runs :func:`ensure` every ``interval_s`` until ``stop`` is set.

    A failed run is retried sooner, with exponential backoff from ``retry_s`` up to the interval
    (a little jitter keeps several runners from retrying in step).
    """
    failures = 0
    while not stop.is_set():
        outcome: EnsureResult | EnsureError
        try:
            outcome = ensure(api, settings, now=clock())
            failures = 0
            wait = interval_s
            if outcome.changed:
                log.info(
                    "certificates brought up to date",
                    extra={"leaf_not_after": str(outcome.leaf_not_after)},
                )
        except EnsureError as exc:
            outcome = exc
            failures += 1
            wait = min(interval_s, retry_s * 2 ** (failures - 1)) * random.uniform(0.9, 1.1)
            log.error("certs ensure failed; retrying", extra={"error": str(exc), "in_s": wait})
        if on_result is not None:
            on_result(outcome)
        stop.wait(wait)
