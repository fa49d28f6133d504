"""`certs ensure` against an apiserver in memory: create, idempotence, renewal, CA rotation."""

from __future__ import annotations

import base64
import datetime as dt
import threading

import kubernetes_validate
import pytest
from cryptography import x509

from gpu_slicer.certs import issue as certs_issue
from gpu_slicer.certs.ensure import EnsureResult, EnsureSettings, ensure, run_periodically
from gpu_slicer.certs.errors import CertInputError, EnsureError
from gpu_slicer.kube import errors as kube_errors
from gpu_slicer.kube.api import Obj
from gpu_slicer.kube.memory import InMemoryKubeApi
from tests.support.certs_cases import CONFIG, NAMESPACE, NOW, SECRET, webhook_configuration

DAY = dt.timedelta(days=1)


def _secret(api: InMemoryKubeApi, name: str) -> Obj:
    return api.get("v1", "Secret", name, NAMESPACE)


def _data(secret: Obj, key: str) -> bytes:
    return base64.b64decode(secret["data"][key])


def _bundle(api: InMemoryKubeApi, index: int = 0) -> list[x509.Certificate]:
    config = api.get("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", CONFIG)
    pem = base64.b64decode(config["webhooks"][index]["clientConfig"]["caBundle"])
    return certs_issue.load_certificates(pem)


def _ca(api: InMemoryKubeApi) -> x509.Certificate:
    return certs_issue.load_certificate(_data(_secret(api, f"{SECRET}-ca"), "tls.crt"))


def _leaf(api: InMemoryKubeApi) -> x509.Certificate:
    return certs_issue.load_certificate(_data(_secret(api, SECRET), "tls.crt"))


def _fp(cert: x509.Certificate) -> str:
    return certs_issue.fingerprint(cert)


def _writes(api: InMemoryKubeApi) -> list[tuple[str, str, str | None]]:
    return [(c.verb, c.kind, c.name) for c in api.calls if c.verb not in ("get", "list")]


def test_a_first_run_creates_both_secrets_and_sets_the_ca_bundle(
    api: InMemoryKubeApi, settings: EnsureSettings
) -> None:
    result = ensure(api, settings, now=NOW)
    assert result.ca_created and result.leaf_issued and result.bundle_patched
    serving = _secret(api, SECRET)
    assert serving["type"] == "kubernetes.io/tls"
    assert set(serving["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    ca, leaf = _ca(api), _leaf(api)
    assert certs_issue.is_signed_by(leaf, ca)
    assert certs_issue.key_matches(leaf, certs_issue.load_key(_data(serving, "tls.key")))
    assert _data(serving, "ca.crt") == certs_issue.bundle_pem([ca])
    assert [_fp(c) for c in _bundle(api)] == [_fp(ca)]
    assert certs_issue.covers(leaf, certs_issue.serving_names(settings.service, NAMESPACE))


def test_the_ca_key_stays_out_of_the_secret_the_webhook_mounts(
    api: InMemoryKubeApi, settings: EnsureSettings
) -> None:
    ensure(api, settings, now=NOW)
    ca_key = _data(_secret(api, f"{SECRET}-ca"), "tls.key")
    assert ca_key not in _secret(api, SECRET)["data"].values()
    assert all(_data(_secret(api, SECRET), k) != ca_key for k in ("tls.crt", "tls.key", "ca.crt"))


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36", "1.37"])
def test_the_secrets_it_writes_validate_against_the_kubernetes_schema(
    api: InMemoryKubeApi, settings: EnsureSettings, version: str
) -> None:
    ensure(api, settings, now=NOW)
    for secret in api.objects("v1", "Secret"):
        kubernetes_validate.validate(secret, version, strict=True)


def test_a_second_run_only_reads(api: InMemoryKubeApi, settings: EnsureSettings) -> None:
    ensure(api, settings, now=NOW)
    api.clear_calls()
    result = ensure(api, settings, now=NOW + 10 * DAY)
    assert not result.changed
    assert _writes(api) == []
    assert {c.verb for c in api.calls} == {"get"}


def test_the_leaf_is_kept_until_its_renewal_window(
    api: InMemoryKubeApi, settings: EnsureSettings
) -> None:
    ensure(api, settings, now=NOW)
    first = _leaf(api)
    just_before = first.not_valid_after_utc - settings.renew_before - dt.timedelta(hours=1)
    assert not ensure(api, settings, now=just_before).leaf_issued
    assert _fp(_leaf(api)) == _fp(first)


def test_the_leaf_is_renewed_in_its_window_without_touching_the_ca_or_the_bundle(
    api: InMemoryKubeApi, settings: EnsureSettings
) -> None:
    ensure(api, settings, now=NOW)
    first, ca = _leaf(api), _ca(api)
    inside = first.not_valid_after_utc - settings.renew_before + dt.timedelta(hours=1)
    api.clear_calls()
    result = ensure(api, settings, now=inside)
    assert result.leaf_issued and "renewal window" in result.leaf_reason
    assert not result.ca_created and not result.bundle_patched
    renewed = _leaf(api)
    assert renewed.not_valid_after_utc > first.not_valid_after_utc
    assert certs_issue.is_signed_by(renewed, ca)
    assert _writes(api) == [("update", "Secret", SECRET)]


def test_a_ca_near_its_end_is_rotated_with_old_and_new_ca_both_trusted(
    api: InMemoryKubeApi, settings: EnsureSettings
) -> None:
    ensure(api, settings, now=NOW)
    old_ca = _ca(api)
    # The CA now has less left than a new leaf's lifetime plus the renewal window.
    late = old_ca.not_valid_after_utc - dt.timedelta(days=settings.days) - settings.renew_before
    late += DAY
    api.clear_calls()
    result = ensure(api, settings, now=late)
    assert result.ca_created and result.leaf_issued and result.bundle_patched
    new_ca = _ca(api)
    assert _fp(new_ca) != _fp(old_ca)
    fingerprints = [_fp(c) for c in _bundle(api)]
    assert fingerprints == [_fp(new_ca), _fp(old_ca)]
    assert certs_issue.is_signed_by(_leaf(api), new_ca)
    # Order that keeps every handshake working: CA stored, bundle widened, then the new leaf.
    assert _writes(api) == [
        ("update", "Secret", f"{SECRET}-ca"),
        ("patch", "MutatingWebhookConfiguration", CONFIG),
        ("update", "Secret", SECRET),
    ]


def test_the_old_ca_leaves_the_bundle_after_the_rotation_grace(
    api: InMemoryKubeApi, settings: EnsureSettings
) -> None:
    ensure(api, settings, now=NOW)
    old_ca = _ca(api)
    late = old_ca.not_valid_after_utc - dt.timedelta(days=settings.days) - settings.renew_before
    ensure(api, settings, now=late + DAY)
    assert len(_bundle(api)) == 2
    assert not ensure(api, settings, now=late + DAY + settings.rotation_grace / 2).bundle_patched
    result = ensure(api, settings, now=late + 2 * DAY + settings.rotation_grace)
    assert result.bundle_patched and not result.leaf_issued
    assert [_fp(c) for c in _bundle(api)] == [_fp(_ca(api))]


def test_a_lost_ca_secret_is_replaced_and_the_old_ca_kept_during_the_grace(
    api: InMemoryKubeApi, settings: EnsureSettings
) -> None:
    ensure(api, settings, now=NOW)
    old_ca = _ca(api)
    api.delete("v1", "Secret", f"{SECRET}-ca", NAMESPACE)
    result = ensure(api, settings, now=NOW + DAY)
    assert result.ca_created and result.ca_reason == "no readable CA"
    assert result.leaf_issued and "not signed by the current CA" in result.leaf_reason
    assert [_fp(c) for c in _bundle(api)] == [_fp(_ca(api)), _fp(old_ca)]


def test_garbage_in_the_serving_secret_is_replaced(
    api: InMemoryKubeApi, settings: EnsureSettings
) -> None:
    ensure(api, settings, now=NOW)
    secret = _secret(api, SECRET)
    secret["data"]["tls.key"] = base64.b64encode(b"garbage").decode()
    api.update(secret)
    result = ensure(api, settings, now=NOW)
    assert result.leaf_issued and result.leaf_reason == "no readable serving certificate"
    assert certs_issue.key_matches(
        _leaf(api), certs_issue.load_key(_data(_secret(api, SECRET), "tls.key"))
    )


def test_a_ca_without_a_subject_key_identifier_still_signs_the_serving_certificate(
    api: InMemoryKubeApi, settings: EnsureSettings
) -> None:
    # A CA made by another tool (openssl without -addext subjectKeyIdentifier) is a valid CA:
    # it is kept, and the leaf it signs verifies against it.
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "site CA")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - DAY)
        .not_valid_after(NOW + 3000 * DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": f"{SECRET}-ca", "namespace": NAMESPACE},
            "data": {
                "tls.crt": base64.b64encode(cert.public_bytes(serialization.Encoding.PEM)).decode(),
                "tls.key": base64.b64encode(key_pem).decode(),
            },
        }
    )
    result = ensure(api, settings, now=NOW)
    assert not result.ca_created and result.leaf_issued
    assert certs_issue.is_signed_by(_leaf(api), cert)


def test_a_secret_for_another_service_name_is_reissued(
    api: InMemoryKubeApi, settings: EnsureSettings
) -> None:
    ensure(api, settings, now=NOW)
    renamed = EnsureSettings(**{**vars(settings), "service": "another-webhook"})
    result = ensure(api, renamed, now=NOW)
    assert result.leaf_issued and "does not name" in result.leaf_reason
    assert certs_issue.dns_names(_leaf(api))[0] == f"another-webhook.{NAMESPACE}.svc"


def test_every_webhook_in_the_configuration_gets_the_bundle_and_keeps_its_other_fields(
    settings: EnsureSettings,
) -> None:
    api = InMemoryKubeApi()
    api.create(webhook_configuration("pods.gpu-slicer.io", "audit.gpu-slicer.io"))
    ensure(api, settings, now=NOW)
    config = api.get("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", CONFIG)
    assert [w["name"] for w in config["webhooks"]] == ["pods.gpu-slicer.io", "audit.gpu-slicer.io"]
    for index, webhook in enumerate(config["webhooks"]):
        assert [_fp(c) for c in _bundle(api, index)] == [_fp(_ca(api))]
        assert webhook["failurePolicy"] == "Ignore"
        assert webhook["clientConfig"]["service"]["path"] == "/mutate-pods"


def test_a_conflicting_writer_makes_the_run_start_over(
    api: InMemoryKubeApi, settings: EnsureSettings
) -> None:
    ensure(api, settings, now=NOW)
    first = _leaf(api)
    api.fail_next("update", kube_errors.Conflict("the object has been modified"), kind="Secret")
    result = ensure(api, settings, now=first.not_valid_after_utc - DAY)
    assert result.leaf_issued
    assert [c.verb for c in api.calls].count("update") >= 2


def test_a_concurrent_creator_is_not_an_error(
    api: InMemoryKubeApi, settings: EnsureSettings
) -> None:
    api.fail_next("create", kube_errors.AlreadyExists("secrets exists"), kind="Secret")
    result = ensure(api, settings, now=NOW)
    assert result.leaf_issued
    assert certs_issue.is_signed_by(_leaf(api), _ca(api))


def test_the_bundle_patch_is_refused_when_the_configuration_changed_meanwhile(
    api: InMemoryKubeApi, settings: EnsureSettings
) -> None:
    api.fail_next("patch", kube_errors.Conflict("modified"), kind="MutatingWebhookConfiguration")
    result = ensure(api, settings, now=NOW)
    assert result.bundle_patched
    patches = [c for c in api.calls if c.verb == "patch"]
    assert len(patches) == 2


def test_a_missing_webhook_configuration_still_gets_the_secrets_made(
    settings: EnsureSettings,
) -> None:
    api = InMemoryKubeApi()
    with pytest.raises(EnsureError, match="MutatingWebhookConfiguration 'gpu-slicer' not found"):
        ensure(api, settings, now=NOW)
    assert {s["metadata"]["name"] for s in api.objects("v1", "Secret")} == {
        SECRET,
        f"{SECRET}-ca",
    }


def test_forbidden_calls_say_which_grants_are_missing(
    api: InMemoryKubeApi, settings: EnsureSettings
) -> None:
    api.fail_next("get", kube_errors.Forbidden("secrets is forbidden"))
    with pytest.raises(EnsureError, match="Grant the ServiceAccount get/create/update on Secrets"):
        ensure(api, settings, now=NOW)


def test_an_unreachable_apiserver_is_an_ensure_error(
    api: InMemoryKubeApi, settings: EnsureSettings
) -> None:
    api.fail_next("get", kube_errors.Unavailable("connection refused"))
    with pytest.raises(EnsureError, match="connection refused"):
        ensure(api, settings, now=NOW)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"renew_before": dt.timedelta(days=90)}, "must be shorter than --days"),
        ({"ca_days": 100}, "must be at least --days"),
        ({"service": "Bad"}, "not a valid Service name"),
    ],
    ids=["window as long as the lifetime", "CA shorter than leaf plus window", "bad service"],
)
def test_settings_that_can_never_work_are_refused_before_any_call(
    api: InMemoryKubeApi, settings: EnsureSettings, change: dict[str, object], fragment: str
) -> None:
    bad = EnsureSettings(**{**vars(settings), **change})
    with pytest.raises(CertInputError, match=fragment):
        ensure(api, bad, now=NOW)
    assert api.calls == []


def test_the_periodic_loop_retries_a_failed_run_and_stops_when_asked(
    api: InMemoryKubeApi, settings: EnsureSettings
) -> None:
    api.fail_next("get", kube_errors.Unavailable("apiserver restarting"))
    stop = threading.Event()
    outcomes: list[EnsureResult | EnsureError] = []

    def record(outcome: EnsureResult | EnsureError) -> None:
        outcomes.append(outcome)
        if len(outcomes) == 3:
            stop.set()

    run_periodically(
        api,
        settings,
        interval_s=0.001,
        retry_s=0.001,
        stop=stop,
        clock=lambda: NOW,
        on_result=record,
    )
    assert isinstance(outcomes[0], EnsureError)
    assert isinstance(outcomes[1], EnsureResult) and outcomes[1].changed
    assert isinstance(outcomes[2], EnsureResult) and not outcomes[2].changed


def _trusted(leaf: x509.Certificate, bundle: list[x509.Certificate]) -> bool:
    return any(certs_issue.is_signed_by(leaf, ca) for ca in bundle)


def test_over_years_of_periodic_runs_the_served_leaf_is_always_trusted_and_valid() -> None:
    """Short lifetimes, a run every 12 hours: every run leaves a valid leaf that the caBundle
    trusts, and the bundle still trusts the leaf from before the run (pods that have not yet
    reloaded keep serving it), across many leaf renewals and several CA rotations."""
    settings = EnsureSettings(
        namespace=NAMESPACE,
        secret=SECRET,
        webhook_config=CONFIG,
        days=10,
        ca_days=30,
        renew_before=dt.timedelta(days=3),
        rotation_grace=dt.timedelta(days=1),
    )
    api = InMemoryKubeApi()
    api.create(webhook_configuration())
    ensure(api, settings, now=NOW)
    cas, leaves = {_fp(_ca(api))}, {_fp(_leaf(api))}
    for step in range(1, 2 * 200):
        now = NOW + step * dt.timedelta(hours=12)
        before = _leaf(api)
        ensure(api, settings, now=now)
        leaf, bundle = _leaf(api), _bundle(api)
        assert certs_issue.is_valid_at(leaf, now)
        assert _trusted(leaf, bundle)
        if certs_issue.is_valid_at(before, now):
            assert _trusted(before, bundle), f"step {step}: the previous leaf lost its CA"
        assert len(bundle) <= 2
        cas.add(_fp(_ca(api)))
        leaves.add(_fp(leaf))
    assert len(cas) >= 5 and len(leaves) >= 20  # the run really rotated both, many times
