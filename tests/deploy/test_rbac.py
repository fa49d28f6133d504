"""RBAC grants each component exactly the API calls its code makes: nothing missing, nothing extra.

What is derived and what is declared (see api_calls.py):
- certs: derived by running ``certs ensure`` through its life (create, idempotent re-run, renewal,
  CA rotation, missing webhook configuration, conflicts) against InMemoryKubeApi and reading its
  ``calls`` log, names included.
- webhook and agent: the table in api_calls.DECLARED, checked both ways against an AST scan of
  every KubeApi call site in webhook/ and slicer/, and for the webhook's template code also
  against the calls it makes when run against InMemoryKubeApi.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass

import pytest

from gpu_slicer.certs.ensure import EnsureSettings, ensure
from gpu_slicer.certs.errors import EnsureError
from gpu_slicer.kube import errors as kube_errors
from gpu_slicer.kube.api import resource_for
from gpu_slicer.kube.memory import RBAC_VERB, InMemoryKubeApi
from gpu_slicer.webhook import templates
from tests.support.api_calls import (
    COMPONENTS,
    DECLARED,
    SERVICE_ACCOUNTS,
    call_sites,
    module_exists,
)
from tests.support.deploy_cases import NAMESPACE, Obj, find, render

NOW = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Need:
    """One permission a call needs: (API group, resource plural, RBAC verb, namespace, name)."""

    group: str
    resource: str
    verb: str
    namespace: str | None
    name: str | None


def _need(
    verb: str, api_version: str, kind: str, namespace: str | None = None, name: str | None = None
) -> Need:
    res = resource_for(api_version, kind)
    named = name if verb in ("get", "update", "patch", "delete") else None
    return Need(
        res.group, res.plural, RBAC_VERB[verb], namespace if res.namespaced else None, named
    )


@dataclass(frozen=True)
class Grant:
    rule: Obj
    namespace: str | None  # None: cluster-wide (ClusterRoleBinding)


def _grants(objects: list[Obj], service_account: str) -> list[Grant]:
    grants: list[Grant] = []
    for binding in objects:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        subjects = binding.get("subjects") or []
        if not any(
            s.get("kind") == "ServiceAccount"
            and s.get("name") == service_account
            and s.get("namespace") == NAMESPACE
            for s in subjects
        ):
            continue
        ref = binding["roleRef"]
        role = find(objects, ref["kind"], ref["name"])
        scope = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        grants.extend(Grant(rule, scope) for rule in role.get("rules") or [])
    return grants


def _allows(grant: Grant, need: Need) -> bool:
    rule = grant.rule
    if grant.namespace is not None and need.namespace != grant.namespace:
        return False
    if need.group not in rule.get("apiGroups", []) and "*" not in rule.get("apiGroups", []):
        return False
    if need.resource not in rule.get("resources", []) and "*" not in rule.get("resources", []):
        return False
    if need.verb not in rule.get("verbs", []) and "*" not in rule.get("verbs", []):
        return False
    names = rule.get("resourceNames")
    return not names or need.name in names


def _check(objects: list[Obj], service_account: str, needs: set[Need]) -> None:
    grants = _grants(objects, service_account)
    assert grants, f"no RBAC bound to ServiceAccount {service_account}"
    missing = sorted(str(n) for n in needs if not any(_allows(g, n) for g in grants))
    assert missing == [], f"{service_account} lacks grants for: {missing}"
    for grant in grants:
        rule = grant.rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    users = [
                        n
                        for n in needs
                        if (n.group, n.resource, n.verb) == (group, resource, verb)
                        and _allows(grant, n)
                    ]
                    assert users, (
                        f"{service_account} is granted {verb} on {group}/{resource}"
                        " but its code never needs it: remove the grant"
                    )
                    for name in rule.get("resourceNames") or []:
                        assert any(n.name == name for n in users), (
                            f"{service_account}: resourceName {name} is never used"
                        )


# ------------------------------------------------------------------ declared vs code
@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_every_api_call_site_in_the_code_is_declared(component: str) -> None:
    declared = DECLARED[component]
    sites = call_sites(COMPONENTS[component])
    assert sites, f"no KubeApi calls found in {COMPONENTS[component]}; has the seam changed?"
    for site in sites:
        if site.kind is not None:
            matches = [
                d
                for d in declared
                if (d.module, d.verb, d.api_version, d.kind)
                == (site.module, site.verb, site.api_version, site.kind)
            ]
        else:
            matches = [d for d in declared if (d.module, d.verb) == (site.module, site.verb)]
        assert matches, (
            f"{site.module}:{site.line} calls {site.verb} {site.api_version or ''} "
            f"{site.kind or '(object argument)'}: add it to api_calls.DECLARED and to the "
            f"{component} RBAC in deploy/base"
        )


@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_every_declared_call_is_still_made_by_the_code(component: str) -> None:
    sites = call_sites(COMPONENTS[component])
    for entry in DECLARED[component]:
        same_verb = [s for s in sites if (s.module, s.verb) == (entry.module, entry.verb)]
        assert any(
            s.kind is None or (s.api_version, s.kind) == (entry.api_version, entry.kind)
            for s in same_verb
        ), f"{entry} is declared but {entry.module} makes no such call: remove it (and its grant)"


def test_the_webhook_template_code_makes_only_declared_calls_when_run() -> None:
    api = InMemoryKubeApi()
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "user", "namespace": "ml"},
            "spec": {
                "containers": [{"name": "c", "image": "x"}],
                "resourceClaims": [
                    {"name": "gpu-slicer", "resourceClaimTemplateName": "gpu-slicer-a"}
                ],
            },
        }
    )
    api.clear_calls()
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": "gpu-slicer-a",
            "namespace": "ml",
            "labels": {"app.kubernetes.io/managed-by": "gpu-slicer"},
        },
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": "gpu.gpu-slicer.io"}}
                    ]
                }
            }
        },
    }
    unused = {**template, "metadata": {**template["metadata"], "name": "gpu-slicer-b"}}
    ensurer = templates.ApiTemplates(api, gc_after_s=lambda: 60)
    ensurer.ensure([template, unused], dry_run=False)
    templates.ApiTemplates(api, gc_after_s=lambda: 60).ensure([template], dry_run=False)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    collector = templates.TemplateCollector(api, gc_after_s=lambda: 60, wall_clock=lambda: later)
    collector.sweep()
    made = {(c.verb, c.api_version, c.kind) for c in api.calls}
    declared = {(d.verb, d.api_version, d.kind) for d in DECLARED["webhook"]}
    assert made <= declared
    assert ("delete", "resource.k8s.io/v1", "ResourceClaimTemplate") in made  # GC ran


@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_rbac_grants_exactly_the_declared_calls(component: str) -> None:
    needs = {_need(d.verb, d.api_version, d.kind, "any-namespace") for d in DECLARED[component]}
    for target in ("base", "overlays/self-managed"):
        _check(render(target), SERVICE_ACCOUNTS[component], needs)


# ------------------------------------------------------------------ certs: derived by running
def _certs_calls() -> set[Need]:
    settings = EnsureSettings(
        namespace=NAMESPACE,
        secret="gpu-slicer-webhook-tls",
        webhook_config="gpu-slicer",
        service="gpu-slicer-webhook",
    )
    api = InMemoryKubeApi()
    with pytest.raises(EnsureError):
        ensure(api, settings, now=NOW)  # before the configuration exists
    calls = list(api.calls)
    api.create(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "gpu-slicer"},
            "webhooks": [{"name": "pods.gpu-slicer.io", "clientConfig": {}}],
        }
    )
    api.clear_calls()  # the test made that one, not certs ensure
    ensure(api, settings, now=NOW)
    ensure(api, settings, now=NOW)  # idempotent
    ensure(api, settings, now=NOW + dt.timedelta(days=settings.days - 1))  # renewal
    api.fail_next("update", kube_errors.Conflict("stale"), kind="Secret")
    ensure(api, settings, now=NOW + dt.timedelta(days=settings.ca_days - 100))  # CA rotation
    calls += api.calls
    needs = {
        _need(c.verb, c.api_version, c.kind, c.namespace, c.name)
        for c in calls
        if c.verb in RBAC_VERB
    }
    return needs


def test_certs_ensure_needs_only_secrets_and_its_webhook_configuration() -> None:
    needs = _certs_calls()
    by_resource: dict[str, set[str]] = defaultdict(set)
    for need in needs:
        by_resource[need.resource].add(need.verb)
    assert dict(by_resource) == {
        "secrets": {"get", "create", "update"},
        "mutatingwebhookconfigurations": {"get", "patch"},
    }
    assert {n.name for n in needs if n.resource == "secrets" and n.name} == {
        "gpu-slicer-webhook-tls",
        "gpu-slicer-webhook-tls-ca",
    }


def test_certs_rbac_grants_exactly_what_ensure_called_by_name() -> None:
    _check(render("overlays/self-managed"), SERVICE_ACCOUNTS["certs"], _certs_calls())


def test_only_the_self_managed_overlays_run_certs_ensure() -> None:
    for target in ("base", "overlays/cert-manager", "overlays/openshift"):
        assert _grants(render(target), SERVICE_ACCOUNTS["certs"]) == []
    assert _grants(render("overlays/extended-resources"), SERVICE_ACCOUNTS["certs"])


def test_declared_entries_name_modules_that_exist() -> None:
    for entries in DECLARED.values():
        for entry in entries:
            assert entry.why, entry
            assert module_exists(entry.module), f"{entry.module} does not exist"
