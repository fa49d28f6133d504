"""Ensuring ResourceClaimTemplates exist, and collecting the ones no pod uses any more."""

from __future__ import annotations

import contextlib
import io
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_slicer.cli.main import main
from gpu_slicer.kube.api import Obj, ObjectList
from gpu_slicer.kube.errors import Forbidden, Unavailable
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.webhook.errors import TemplateError
from gpu_slicer.webhook.templates import (
    LAST_REFERENCED,
    ApiTemplates,
    TemplateCollector,
)

RCT = ("resource.k8s.io/v1", "ResourceClaimTemplate")
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


class Clocks:
    def __init__(self) -> None:
        self.mono = 1000.0
        self.wall = T0

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += timedelta(seconds=seconds)


def template(name: str = "gpu-slicer-abc123", namespace: str = "ml") -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "gpu-slicer"},
        },
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "main",
                            "exactly": {"deviceClassName": "mig.gpu-slicer.io", "count": 1},
                        }
                    ]
                }
            }
        },
    }


def pod(name: str, template_name: str, namespace: str = "ml") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [{"name": "main", "image": "x"}],
            "resourceClaims": [{"name": "gpu-slicer", "resourceClaimTemplateName": template_name}],
        },
    }


@pytest.fixture
def api() -> Iterator[InMemoryKubeApi]:
    memory = InMemoryKubeApi()
    yield memory
    memory.close()


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


def ensurer(
    api: InMemoryKubeApi, clocks: Clocks, gc_after_s: int = 86400, ttl_s: float = 600.0
) -> ApiTemplates:
    return ApiTemplates(
        api,
        ttl_s=ttl_s,
        gc_after_s=lambda: gc_after_s,
        clock=lambda: clocks.mono,
        wall_clock=lambda: clocks.wall,
    )


def stored(api: InMemoryKubeApi) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in api.objects(*RCT)}


# ----------------------------------------------------------------------------- ensuring


def test_a_missing_template_is_created_managed_and_stamped(
    api: InMemoryKubeApi, clocks: Clocks
) -> None:
    ensurer(api, clocks).ensure([template()], dry_run=False)
    created = stored(api)["gpu-slicer-abc123"]
    assert created["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpu-slicer"
    assert created["metadata"]["labels"]["gpu-slicer.io/origin"] == "webhook"
    assert created["metadata"]["annotations"][LAST_REFERENCED] == "2026-11-01T12:00:00Z"
    assert created["spec"] == template()["spec"]


def test_an_existing_template_is_success_and_its_stamp_is_refreshed(
    api: InMemoryKubeApi, clocks: Clocks
) -> None:
    api.create(template())
    ensurer(api, clocks).ensure([template()], dry_run=False)
    assert stored(api)["gpu-slicer-abc123"]["metadata"]["annotations"][LAST_REFERENCED] == (
        "2026-11-01T12:00:00Z"
    )


def test_a_known_template_costs_no_api_call_until_the_cache_entry_expires(
    api: InMemoryKubeApi, clocks: Clocks
) -> None:
    templates = ensurer(api, clocks, ttl_s=600)
    templates.ensure([template()], dry_run=False)
    api.clear_calls()
    for _ in range(10):
        templates.ensure([template()], dry_run=False)
    assert api.calls == []
    clocks.advance(601)
    templates.ensure([template()], dry_run=False)
    assert [c.verb for c in api.calls] == ["create", "patch"]


def test_the_cache_is_never_trusted_longer_than_half_the_gc_delay(
    api: InMemoryKubeApi, clocks: Clocks
) -> None:
    assert ensurer(api, clocks, gc_after_s=100, ttl_s=600).ttl_s() == 50
    assert ensurer(api, clocks, gc_after_s=86400, ttl_s=600).ttl_s() == 600


def test_a_shorter_gc_delay_from_a_policy_reload_shortens_trust_in_cached_templates(
    api: InMemoryKubeApi, clocks: Clocks
) -> None:
    # Cached under templateGcAfter 24h (trusted 600 s), then the policy says 120 s: the
    # collector may delete the template 120 s after its stamp, so the cache must not vouch for
    # it beyond 60 s any more, or pods are admitted naming a deleted template.
    gc_after = [86400]
    templates = ApiTemplates(
        api,
        ttl_s=600,
        gc_after_s=lambda: gc_after[0],
        clock=lambda: clocks.mono,
        wall_clock=lambda: clocks.wall,
    )
    templates.ensure([template()], dry_run=False)
    gc_after[0] = 120
    clocks.advance(61)
    api.clear_calls()
    templates.ensure([template()], dry_run=False)
    assert [c.verb for c in api.calls] == ["create", "patch"]


def test_dry_run_never_calls_the_api(api: InMemoryKubeApi, clocks: Clocks) -> None:
    ensurer(api, clocks).ensure([template()], dry_run=True)
    assert api.calls == [] and stored(api) == {}


def test_an_unreachable_api_is_a_template_error(api: InMemoryKubeApi, clocks: Clocks) -> None:
    api.fail_next("create", Unavailable("dial tcp 10.0.0.1:443: connection refused"))
    templates = ensurer(api, clocks)
    with pytest.raises(TemplateError, match="connection refused"):
        templates.ensure([template()], dry_run=False)
    assert not templates.is_known("ml", "gpu-slicer-abc123")  # the next pod tries again
    templates.ensure([template()], dry_run=False)
    assert "gpu-slicer-abc123" in stored(api)


def test_missing_rbac_says_which_permission_to_grant(api: InMemoryKubeApi, clocks: Clocks) -> None:
    api.fail_next("create", Forbidden("cannot create resourceclaimtemplates"))
    with pytest.raises(TemplateError, match="create and patch on resourceclaimtemplates"):
        ensurer(api, clocks).ensure([template()], dry_run=False)


def test_a_template_deleted_between_create_and_stamp_is_created_again(
    api: InMemoryKubeApi, clocks: Clocks
) -> None:
    api.create(template())

    original_patch = api.patch

    def patch_after_delete(*args: Any, **kwargs: Any) -> Obj:
        api.delete(*RCT, "gpu-slicer-abc123", "ml")
        api.patch = original_patch  # type: ignore[method-assign]
        return original_patch(*args, **kwargs)

    api.patch = patch_after_delete  # type: ignore[method-assign]
    ensurer(api, clocks).ensure([template()], dry_run=False)
    assert "gpu-slicer-abc123" in stored(api)


# ----------------------------------------------------------------------------- collecting


def collector(
    api: Any, clocks: Clocks, gc_after_s: int = 3600, forgotten: list[str] | None = None
) -> TemplateCollector:
    return TemplateCollector(
        api,
        gc_after_s=lambda: gc_after_s,
        wall_clock=lambda: clocks.wall,
        forget=lambda ns, name: (forgotten if forgotten is not None else []).append(f"{ns}/{name}"),
    )


def test_an_unreferenced_template_is_deleted_only_after_the_delay(
    api: InMemoryKubeApi, clocks: Clocks
) -> None:
    ensurer(api, clocks).ensure([template()], dry_run=False)
    forgotten: list[str] = []
    gc = collector(api, clocks, gc_after_s=3600, forgotten=forgotten)
    clocks.advance(3599)
    assert gc.sweep().deleted == []
    clocks.advance(2)
    assert gc.sweep().deleted == ["ml/gpu-slicer-abc123"]
    assert stored(api) == {}
    assert forgotten == ["ml/gpu-slicer-abc123"]


def test_a_referenced_template_is_kept_and_its_stamp_refreshed(
    api: InMemoryKubeApi, clocks: Clocks
) -> None:
    ensurer(api, clocks).ensure([template()], dry_run=False)
    api.create(pod("trainer-0", "gpu-slicer-abc123"))
    gc = collector(api, clocks, gc_after_s=3600)
    clocks.advance(10 * 3600)
    result = gc.sweep()
    assert result.deleted == [] and result.stamped == ["ml/gpu-slicer-abc123"]
    api.delete("v1", "Pod", "trainer-0", "ml")
    clocks.advance(1800)
    assert gc.sweep().deleted == []  # the pod was seen recently: wait the full delay again
    clocks.advance(1801)
    assert gc.sweep().deleted == ["ml/gpu-slicer-abc123"]


def test_templates_not_managed_by_gpu_slicer_are_never_touched(
    api: InMemoryKubeApi, clocks: Clocks
) -> None:
    mine = template("hand-made")
    mine["metadata"]["labels"] = {}
    api.create(mine)
    clocks.advance(10**6)
    assert collector(api, clocks).sweep().deleted == []
    assert "hand-made" in stored(api)


def test_templates_that_convert_wrote_for_git_are_never_collected(
    api: InMemoryKubeApi, clocks: Clocks, tmp_path: Path
) -> None:
    """A Deployment scaled to zero (or a suspended CronJob) from a converted tree has no pod
    for days; its template, applied from Git, must still be there when it scales up."""
    source = tmp_path / "cron.yaml"
    source.write_text(
        "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: nightly, namespace: ml}\n"
        "spec:\n  schedule: '@daily'\n  suspend: true\n  jobTemplate:\n    spec:\n"
        "      template:\n        spec:\n          restartPolicy: Never\n          containers:\n"
        "          - {name: main, image: x, resources: {limits: {nvidia.com/gpu: 1}}}\n"
    )
    out = tmp_path / "out.yaml"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main(["convert", str(source)]) == 0
    out.write_text(printed.getvalue())
    from_git = [d for d in yaml.safe_load_all(out.read_text()) if d][-1]
    assert from_git["metadata"]["labels"]["gpu-slicer.io/origin"] == "convert"
    from_git["metadata"]["annotations"] = {LAST_REFERENCED: "2026-11-01T12:00:00Z"}
    api.create(from_git)
    ensurer(api, clocks).ensure([template("gpu-slicer-fromwebhook")], dry_run=False)
    clocks.advance(10**6)
    assert collector(api, clocks).sweep().deleted == ["ml/gpu-slicer-fromwebhook"]
    assert list(stored(api)) == [from_git["metadata"]["name"]]
    ensurer(api, clocks).ensure([from_git], dry_run=False)  # the webhook meets it again
    clocks.advance(10**6)
    assert collector(api, clocks).sweep().deleted == []


def test_templates_made_before_the_origin_label_are_the_webhooks_and_collected(
    api: InMemoryKubeApi, clocks: Clocks
) -> None:
    old = template("gpu-slicer-old")  # managed-by only, as older webhooks wrote them
    old["metadata"]["annotations"] = {LAST_REFERENCED: "2026-11-01T12:00:00Z"}
    api.create(old)
    clocks.advance(10**6)
    assert collector(api, clocks).sweep().deleted == ["ml/gpu-slicer-old"]


def test_gc_after_zero_turns_collection_off(api: InMemoryKubeApi, clocks: Clocks) -> None:
    api.create(template())
    clocks.advance(10**6)
    assert collector(api, clocks, gc_after_s=0).sweep().deleted == []
    assert api.calls[-1].verb == "create"


class StampDuringSweep:
    """An API through which another replica stamps the template while the sweep re-checks."""

    def __init__(self, api: InMemoryKubeApi, stamp: str) -> None:
        self.api = api
        self.stamp = stamp
        self.pod_lists = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)

    def list(
        self, api_version: str, kind: str, namespace: str | None = None, **kwargs: Any
    ) -> ObjectList:
        result = self.api.list(api_version, kind, namespace, **kwargs)
        if kind == "Pod":
            self.pod_lists += 1
            if self.pod_lists == 2:  # the re-check just before deleting
                self.api.patch(
                    *RCT,
                    "gpu-slicer-abc123",
                    {"metadata": {"annotations": {LAST_REFERENCED: self.stamp}}},
                    namespace="ml",
                )
        return result


def test_a_stamp_written_by_another_replica_during_the_sweep_stops_the_delete(
    api: InMemoryKubeApi, clocks: Clocks
) -> None:
    ensurer(api, clocks).ensure([template()], dry_run=False)
    clocks.advance(7200)
    racing = StampDuringSweep(api, "2026-11-01T14:00:00Z")
    result = collector(racing, clocks).sweep()
    assert result.deleted == [] and result.kept == ["ml/gpu-slicer-abc123"]
    assert "gpu-slicer-abc123" in stored(api)


def test_several_replicas_sweeping_at_once_delete_each_template_once(
    api: InMemoryKubeApi, clocks: Clocks
) -> None:
    for index in range(20):
        ensurer(api, clocks).ensure([template(f"gpu-slicer-{index:04d}")], dry_run=False)
    api.create(pod("keeper", "gpu-slicer-0007"))
    clocks.advance(7200)
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def replica() -> None:
        try:
            results.append(collector(api, clocks).sweep().deleted)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=replica) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    deleted = [name for names in results for name in names]
    assert len(deleted) == len(set(deleted)) == 19
    assert list(stored(api)) == ["gpu-slicer-0007"]


def test_the_template_as_created_validates_for_every_supported_kubernetes_version(
    api: InMemoryKubeApi, clocks: Clocks
) -> None:
    from gpu_slicer.webhook.policy import Policy
    from gpu_slicer.webhook.translate import translate_pod
    from tests.support.server_fixtures import mig_pod
    from tests.support.webhook_cases import validate

    conversion = translate_pod(mig_pod("2g.20gb"), namespace="ml", policy=Policy.default())
    ensurer(api, clocks).ensure(conversion.templates, dry_run=False)
    (created,) = api.objects(*RCT)
    validate(created)


def test_only_one_worker_of_a_pod_holds_the_gc_lock(tmp_path: Path) -> None:
    from gpu_slicer.webhook.server import gc_leader

    first, second = gc_leader(str(tmp_path)), gc_leader(str(tmp_path))
    assert first() is True
    assert second() is False
    assert first() is True  # held for the life of the worker


def test_the_collector_loop_sweeps_on_its_interval_when_it_leads(
    api: InMemoryKubeApi, clocks: Clocks
) -> None:
    import time

    from gpu_slicer.webhook.templates import CollectorLoop

    ensurer(api, clocks).ensure([template()], dry_run=False)
    clocks.advance(7200)
    turns: list[bool] = [False, True]
    loop = CollectorLoop(
        collector(api, clocks), interval_s=0.01, may_run=lambda: turns.pop(0) if turns else True
    )
    loop.start()
    try:
        deadline = time.monotonic() + 5
        while stored(api):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        loop.stop()
    assert turns == []  # it waited for its turn as leader
