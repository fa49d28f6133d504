"""Upgrading from 0.1 with converted pods running, on the real node with the chart's pods.

0.1 published under the driver name ``gpu-slicer.io``; this release publishes under
``z.gpu-slicer.io`` (where a driver's name sorts decides what every other driver's pods pay,
docs/install-kubernetes.md). A claim keeps the driver name of its allocation for its whole life,
so the pods 0.1 started must keep their devices through the upgrade and still terminate
normally after it, and the new pool must not hand out what they hold.

0.1 is built from the repository's history (:mod:`sandbox.releases`: its tree exported with
``git archive`` at its commit, its image from its own Dockerfile) and imported into the real
node beside the current image. The sandbox installs the current chart; the module moves the
release to 0.1 (``helm upgrade`` with 0.1's chart and image, nothing running yet), starts
converted pods there, then upgrades to the current chart as docs/upgrading.md says an admin
does: ``helm upgrade`` with the same values.

Skipped with the reason where the machine cannot run containers, the parts cannot be built or
the checkout lacks 0.1's commit (a shallow clone); under ``CI=true`` only the last skips.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from gpu_slicer.core.identity import DRIVER, LEGACY_DRIVERS
from gpu_slicer.sandbox import binaries, chart_pods, image, releases
from gpu_slicer.sandbox.errors import BuildError
from gpu_slicer.sandbox.process import free_port
from tests.support.chart_release import (
    AdmissionCount,
    cdi_claims,
    checkpoint_claims,
    helm,
    pod_log,
    release_pods,
    started,
)
from tests.support.e2e_sandbox import ENABLED, Obj, Sandbox, chart_pods_sandbox
from tests.support.real_node_probe import latest_report, probe_pod

NODE = "real"
GPUS = "A100-80GB:1"
LIMITS = {"nvidia.com/mig-1g.10gb": "1"}
CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gpu-slicer"
OLD = LEGACY_DRIVERS[0]


@pytest.fixture(scope="module")
def previous() -> tuple[Path, Path]:
    """0.1's source tree (its chart inside) and its image archive, built into the cache after
    the current image (the cache keeps the newest images)."""
    progress = lambda m: print(f"[e2e] {m}", flush=True)  # noqa: E731
    try:
        tree = releases.source()
        image.ensure(progress=progress)
        archive = releases.image_archive(progress=progress)
    except releases.HistoryMissing as exc:
        pytest.skip(str(exc))
    except (BuildError, image.ImageToolsMissing) as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the images cannot be built here: {exc}")
        pytest.skip(f"the images cannot be built here: {exc}")
    return tree, archive


@pytest.fixture(scope="module")
def box(kube_binaries: binaries.Binaries, previous: tuple[Path, Path]) -> Iterator[Sandbox]:
    _, archive = previous
    with chart_pods_sandbox(
        "gs-upgrade-", NODE, GPUS, "--agent-pod", "--webhook-pod", "--import-image", str(archive)
    ) as running:
        running.core.create_namespace(
            {"metadata": {"name": ENABLED, "labels": {"gpu-slicer.io/migration": "enabled"}}}
        )
        running.wait(
            lambda: running.core.read_namespaced_service_account("default", ENABLED),
            what=f"{ENABLED}'s default ServiceAccount",
        )
        yield running


def _move_to(box: Sandbox, chart: Path, tag: str) -> None:
    """``helm upgrade`` of the release to ``chart`` with the sandbox's values and image
    ``tag``, until the new agent pod has registered with the kubelet and the webhook serves.

    The sandbox's webhook pod runs on the node's network, pinned to its one node, so the
    rollout's new pod could not start beside the old one on the same port: each move gives it
    a new port (the Service follows; a cluster's webhook pods need no such thing)."""
    before = {p["metadata"]["uid"] for p in release_pods(box, "agent")}
    done = helm(
        box,
        "upgrade",
        "gpu-slicer",
        str(chart),
        "--values",
        str(box.dir / "helm-values.yaml"),
        "--set",
        f"image.tag={tag}",
        "--set",
        f"webhook.port={free_port()}",
        "--timeout",
        "4m",
    )
    assert done.returncode == 0, done.stderr

    def agent_ready() -> bool:
        pods = [p for p in release_pods(box, "agent") if p["metadata"]["uid"] not in before]
        return bool(
            len(pods) == 1
            and pods[0]["spec"]["containers"][0]["image"].endswith(f":{tag}")
            and pods[0]["status"].get("phase") == "Running"
            and "registered with the kubelet" in pod_log(box, pods[0])
            and len(release_pods(box, "agent")) == 1
        )

    box.wait(agent_ready, what=f"the {tag} agent pod registered with the kubelet", timeout_s=240)
    _webhook_rolled_to(box, tag)


@contextmanager
def _every_admission_converted(
    box: Sandbox, during: str, *, replacing_0_1: bool = False
) -> Iterator[None]:
    """Pods keep arriving while the body changes the release (:class:`AdmissionCount`): every
    one is converted, none fails, and enough arrive to say so.

    ``replacing_0_1``: the body stops 0.1's webhook pod, whose worker closes its idle
    kept-alive connections the moment it stops; a review the apiserver is writing on one then
    is lost, and the apiserver admits that pod unconverted (docs/upgrading.md). Such a loss, at
    most one per connection, is the only failure allowed: sent or answered while a 0.1 pod was
    stopping, and the apiserver failing open (the webhook never answered it)."""
    with AdmissionCount(box, ENABLED, LIMITS) as admissions:
        yield
        time.sleep(3)  # the replaced webhook pod's endpoint leaving the apiserver's view
    print(f"[e2e] admissions during {during}: {admissions.converted} converted")
    print(admissions.report())
    assert admissions.converted >= 20
    if not replacing_0_1:
        assert admissions.failures == [], admissions.report()
        return
    assert admissions.outside_stops_of(releases.PREVIOUS.version) == [], admissions.report()
    assert len(admissions.failures) <= 2, admissions.report()
    assert all(f.what == "admitted unconverted" for f in admissions.failures), admissions.report()
    assert admissions.failed_open == len(admissions.failures), admissions.report()


def _webhook_rolled_to(box: Sandbox, tag: str) -> None:
    """Until the webhook serves and every pod of its Deployment runs ``tag`` (the old ones
    gone, not only terminating)."""
    chart_pods.wait_webhook_pod(box.kubeconfig, 240)
    box.wait(
        lambda: all(
            p["spec"]["containers"][0]["image"].endswith(f":{tag}")
            for p in release_pods(box, "webhook")
        ),
        what=f"only {tag} webhook pods",
        timeout_s=240,
    )


def _pool(box: Sandbox) -> dict[str, set[str]]:
    """The node's published devices by driver name."""
    pools: dict[str, set[str]] = {}
    for s in box.resource.list_resource_slice(field_selector=f"spec.nodeName={NODE}").items:
        names = {d.name for d in s.spec.devices or ()}
        pools.setdefault(s.spec.driver, set()).update(names)
    return pools


def _converted(box: Sandbox, name: str) -> Obj:
    """A converted probe pod, running: its claim, container and first report. Deleted with a
    grace period, as pods are, so that it leaves the API only once the kubelet has released
    its claim (the sandbox's usual 0 would remove it at once whatever the kubelet does)."""
    pod = probe_pod(name, NODE, LIMITS, repeat=True)
    pod["spec"]["terminationGracePeriodSeconds"] = 3
    box.create_pod(ENABLED, pod)
    pod = box.wait_running(ENABLED, name, timeout_s=150)
    [claim] = box.claims_of(pod)
    [result] = claim["status"]["allocation"]["devices"]["results"]
    return {
        "name": name,
        "driver": result["driver"],
        "device": result["device"],
        "claim": claim["metadata"]["uid"],
        "report": latest_report(box, name, ENABLED),
        "started": started(box, ENABLED, name),
    }


def _undisturbed(box: Sandbox, pod: Obj) -> None:
    """Still its first container, seeing in a report made now what it saw at first, with its
    claim's CDI file on the node."""
    number, seen = latest_report(box, pod["name"], ENABLED, after=pod["report"][0])
    assert seen == pod["report"][1], f"{pod['name']} sees other devices now"
    assert started(box, ENABLED, pod["name"]) == pod["started"]
    assert f"k8s.gpu-slicer.io-claim_{pod['claim']}.json" in cdi_claims(box, NODE)
    pod["report"] = (number, seen)


def test_an_upgrade_from_0_1_keeps_running_pods_their_devices_and_serves_new_ones(
    box: Sandbox, previous: tuple[Path, Path]
) -> None:
    # 0.1, installed with pods running on it.
    _move_to(box, previous[0] / "deploy" / "helm" / "gpu-slicer", releases.PREVIOUS.version)
    box.wait(lambda: OLD in _pool(box), what="0.1's agent publishing its pool", timeout_s=120)
    old = [_converted(box, f"old-{i}") for i in range(2)]
    assert {p["driver"] for p in old} == {OLD}
    held = {p["device"] for p in old}
    assert len(box.instances(NODE)) == 2

    # The upgrade, as the admin runs it, while pods keep arriving: the webhook's rollout
    # (a new pod ready before the old one goes) converts every one of them, but for what 0.1's
    # replica may drop as it stops.
    with _every_admission_converted(box, "the upgrade", replacing_0_1=True):
        _move_to(box, CHART, image.version())

    box.wait(
        lambda: set(_pool(box)) == {DRIVER},
        what="the new agent replacing 0.1's pool with its own",
        timeout_s=120,
    )
    # What 0.1's claims hold is not offered again: the scheduler counts those claims only
    # against 0.1's pool, which is gone.
    assert not held & _pool(box)[DRIVER]
    for pod in old:
        _undisturbed(box, pod)
    assert len(box.instances(NODE)) == 2

    # New pods are converted, allocated under the new name, prepared beside the old ones.
    new = _converted(box, "new-0")
    assert new["driver"] == DRIVER
    assert new["device"] not in held
    instances = box.instances(NODE)
    assert len(instances) == 3 and len({start for _, _, start in instances}) == 3

    # A pod of 0.1 ends normally: the kubelet releases its claim through the agent's
    # registration under 0.1's name, and the agent destroys its instance.
    box.delete_pod(ENABLED, old[0]["name"])
    box.wait(lambda: len(box.instances(NODE)) == 2, what="old-0's instance destroyed")
    assert f"k8s.gpu-slicer.io-claim_{old[0]['claim']}.json" not in cdi_claims(box, NODE)
    _undisturbed(box, old[1])
    _undisturbed(box, new)

    for pod in (old[1], new):
        box.delete_pod(ENABLED, pod["name"])
    box.wait(lambda: box.instances(NODE) == [], what="every instance destroyed")
    assert cdi_claims(box, NODE) == []
    assert checkpoint_claims(box, NODE) == {}


def _revisions(box: Sandbox) -> dict[str, int]:
    """The release's newest revision of each app version."""
    done = helm(box, "history", "gpu-slicer", "-o", "json")
    assert done.returncode == 0, done.stderr
    return {str(r["app_version"]): int(r["revision"]) for r in json.loads(done.stdout)}


def test_a_rollback_to_0_1_with_a_pod_of_the_new_name_running_is_refused_and_harms_nothing(
    box: Sandbox, previous: tuple[Path, Path]
) -> None:
    """0.1 knows only the old name: it would take the running pod's claim for a released one
    and destroy its instance. Its agent refuses the checkpoint instead (format 3) and says
    which release to run; rolling forward again finishes the pod normally. Pods that arrive
    while the webhook rolls back are converted all along; while it rolls forward, all but what
    0.1's replica may lose as it stops (:func:`_every_admission_converted`)."""
    if releases.PREVIOUS.version not in _revisions(box):  # run alone: give the release one
        _move_to(box, previous[0] / "deploy" / "helm" / "gpu-slicer", releases.PREVIOUS.version)
        _move_to(box, CHART, image.version())
    revisions = _revisions(box)
    before = box.instances(NODE)  # the earlier test's pods, had it failed with them running
    kept = _converted(box, "kept")
    assert kept["driver"] == DRIVER
    instances = box.instances(NODE)

    with _every_admission_converted(box, "the rollback"):
        done = helm(
            box,
            "rollback",
            "gpu-slicer",
            str(revisions[releases.PREVIOUS.version]),
            "--timeout",
            "4m",
        )
        assert done.returncode == 0, done.stderr
        _webhook_rolled_to(box, releases.PREVIOUS.version)

    def refusing() -> bool:
        for pod in release_pods(box, "agent"):
            if pod["spec"]["containers"][0]["image"].endswith(f":{releases.PREVIOUS.version}"):
                said = ""
                for previous_run in (True, False):  # the crashed start's log, else this one's
                    try:
                        said += str(
                            box.core.read_namespaced_pod_log(
                                pod["metadata"]["name"], "gpu-slicer", previous=previous_run
                            )
                        )
                    except ApiException:
                        continue  # no earlier start yet, or this one not started
                return f"is format version 3, written by gpu-slicer {image.version()}" in said
        return False

    box.wait(refusing, what="0.1's agent refusing the checkpoint", timeout_s=240)
    _undisturbed(box, kept)
    assert box.instances(NODE) == instances

    with _every_admission_converted(box, "rolling forward again", replacing_0_1=True):
        done = helm(
            box, "rollback", "gpu-slicer", str(revisions[image.version()]), "--timeout", "4m"
        )
        assert done.returncode == 0, done.stderr
        _webhook_rolled_to(box, image.version())
    box.wait(
        lambda: any(
            p["spec"]["containers"][0]["image"].endswith(f":{image.version()}")
            and "registered with the kubelet" in pod_log(box, p)
            for p in release_pods(box, "agent")
            if p["status"].get("phase") == "Running"
        ),
        what="the current agent back",
        timeout_s=240,
    )
    _undisturbed(box, kept)
    box.delete_pod(ENABLED, "kept")
    box.wait(lambda: box.instances(NODE) == before, what="kept's instance destroyed")
    assert f"k8s.gpu-slicer.io-claim_{kept['claim']}.json" not in cdi_claims(box, NODE)
