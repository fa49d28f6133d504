"""Hollow nodes: a real control plane and Node objects with the ResourceSlices an agent would
publish, and nothing running behind them, to measure the real kube-scheduler at cluster size.

A hollow node is what the scheduler sees of a node (a Ready Node, its ResourceSlices); no agent,
no kubelet. Pods are created held by a scheduling gate, each with its own ResourceClaim (created
directly, so the controller manager's client rate does not pace the run), and released
together; a run times from the first release until every pod is bound and reads the
scheduler's CPU time from ``/proc`` (Linux). :mod:`bench.bench_scheduler` drives it; the
end-to-end tier checks on a few nodes that it schedules what it should.

Two kinds of devices:

* gpu-slicer's pool for simulated GPUs, exactly as ``gpu-slicer slices`` prints it
  (:func:`slicer.preview.preview_pool`): partitionable, or the static layout;
* a stand-in for another vendor's driver (:data:`PLAIN_DRIVER`): the same number of devices per
  node, without counters, a few attributes each. Its pods are the baseline, and measured again
  while gpu-slicer's slices exist to show what those cost everyone else.
"""

from __future__ import annotations

import copy
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from gpu_slicer.core.devices import DeviceSpec
from gpu_slicer.core.identity import RESOURCE_API
from gpu_slicer.kube.client import RealKubeApi
from gpu_slicer.kube.errors import KubeError, NotFound
from gpu_slicer.sandbox import binaries, pki
from gpu_slicer.sandbox.cluster import ClusterSetup
from gpu_slicer.sandbox.controlplane import ControlPlane, feature_gates
from gpu_slicer.sandbox.process import free_port
from gpu_slicer.slicer.device_attributes import DeviceAttributes
from gpu_slicer.slicer.layout import StaticLayout
from gpu_slicer.slicer.preview import preview_pool
from gpu_slicer.slicer.profile_filter import ProfileChoice
from gpu_slicer.webhook.claims import template_object

Obj = dict[str, Any]
T = TypeVar("T")
_counter = itertools.count()

PLAIN_DRIVER = "plain.devices.example.com"
"""Another vendor's DRA driver, stood in: devices without counters (a NIC, an FPGA, a GPU
driver without MIG). Its name sorts after ``gpu-slicer.io``, as ``gpu.nvidia.com`` does: the
scheduler's allocator looks through a node's pools in the order of their drivers' names, so
such a driver's pods evaluate their class's selector on every gpu-slicer device first."""
PLAIN_PER_SLICE = 100
"""Devices per plain slice (the API allows 128 without counters)."""
GATE = "bench.gpu-slicer.io/hold"
"""The scheduling gate that holds a pod until the run releases it."""
SCHEDULER_QPS = 1000.0
"""The measured scheduler's client rate: high enough that binding never waits on it."""


def plain_device_class(driver: str = PLAIN_DRIVER) -> Obj:
    """The stand-in driver's DeviceClass, named after the driver, selecting by driver name."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": driver},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
    }


def plain_claim_spec(driver: str = PLAIN_DRIVER) -> Obj:
    """A claim for one device of the stand-in driver."""
    return {"devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": driver}}]}}


def plain_slices(node: str, devices: int, driver: str = PLAIN_DRIVER) -> list[Obj]:
    """``devices`` plain devices on ``node``, in slices of :data:`PLAIN_PER_SLICE`."""
    chunks = [
        range(start, min(start + PLAIN_PER_SLICE, devices))
        for start in range(0, devices, PLAIN_PER_SLICE)
    ]
    return [
        {
            "apiVersion": RESOURCE_API,
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}-{seq}"},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": len(chunks)},
                "devices": [
                    {
                        "name": f"dev-{i}",
                        "attributes": {
                            "index": {"int": i},
                            "model": {"string": "plain-accelerator"},
                        },
                        "capacity": {"memory": {"value": "16Gi"}},
                    }
                    for i in chunks_range
                ],
            },
        }
        for seq, chunks_range in enumerate(chunks)
    ]


def gpu_slicer_slices(
    node: str,
    gpus: str,
    server_version: tuple[int, int],
    *,
    static_layout: StaticLayout | None = None,
    profiles: ProfileChoice | None = None,
    attributes: DeviceAttributes = "full",
    allocated: Sequence[DeviceSpec] = (),
) -> list[Obj]:
    """The ResourceSlices gpu-slicer's agent publishes on ``node`` (partitionable, or the static
    layout when one is given; only ``profiles`` when given, as the agent's ``--profiles``; each
    device with the agent's ``--attributes``; while claims hold the ``allocated`` devices)."""
    plan = preview_pool(
        node,
        gpus,
        server_version=server_version,
        static_layout=static_layout,
        profiles=profiles,
        attributes=attributes,
        allocated=allocated,
    )
    return [dict(s) for s in plan.slices]


def as_driver(slices: Iterable[Obj], driver: str) -> list[Obj]:
    """The same pool published under another driver name: where a driver's name sorts
    decides what other drivers' pods pay (``bench_scheduler`` puts gpu-slicer's pool under
    its earlier name, which sorted first). The agent qualifies every attribute and capacity
    with its domain, so claims select them unchanged whatever the driver is called."""
    out: list[Obj] = []
    for original in slices:
        obj = copy.deepcopy(original)
        obj["metadata"]["name"] = obj["metadata"]["name"].replace(obj["spec"]["driver"], driver)
        obj["spec"]["driver"] = driver
        out.append(obj)
    return out


def _scheduled_at(api: RealKubeApi, namespace: str, pod: str) -> float | None:
    """When the scheduler bound ``pod`` (epoch seconds), from its ``Scheduled`` event."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for event in api.list("events.k8s.io/v1", "Event", namespace).items:
            if event.get("reason") == "Scheduled" and event["regarding"].get("name") == pod:
                stamp = event.get("eventTime")
                if stamp:
                    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        time.sleep(0.1)
    return None


def device_count(slices: Iterable[Obj]) -> int:
    return sum(len(s["spec"].get("devices") or ()) for s in slices)


@dataclass
class RunResult:
    """One workload's run: how many pods were released and bound, in how long, at what cost."""

    workload: str
    released: int
    bound: int
    seconds: float
    scheduler_cpu_s: float
    unschedulable: int = 0

    @property
    def pods_per_s(self) -> float:
        return self.bound / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_ms_per_pod(self) -> float:
        return 1000 * self.scheduler_cpu_s / self.bound if self.bound else float("nan")


def process_cpu_s(pid: int) -> float:
    """User plus system CPU time of a process (Linux ``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


@dataclass
class HollowCluster:
    """A control plane (etcd, apiserver, controller manager, scheduler) with hollow nodes."""

    state_dir: Path
    k8s_version: str = binaries.DEFAULT_MINOR
    kube_bin: Path | None = None
    partitionable: bool | None = None
    controller_manager_qps: float | None = 100.0
    progress: Callable[[str], None] = print
    plane: ControlPlane | None = None
    api: RealKubeApi | None = None
    setup: ClusterSetup | None = None
    """Admin actions through the typed client (nodes, pod deletion with options)."""
    workers: int = 8
    api_version: tuple[int, int] = (0, 0)
    """The apiserver's (major, minor), read once it runs."""

    def start(self) -> None:
        bins = binaries.ensure(self.k8s_version, kube_bin=self.kube_bin, progress=self.progress)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.plane = ControlPlane(
            bins,
            pki.create(self.state_dir / "pki"),
            self.state_dir,
            free_port(),
            gates=feature_gates(partitionable=self.partitionable),
            controller_manager_qps=self.controller_manager_qps,
            scheduler_qps=SCHEDULER_QPS,
        )
        self.progress(f"starting Kubernetes {bins.release} (hollow nodes)")
        self.plane.start()
        self.setup = ClusterSetup(self.plane.admin_kubeconfig())
        self.setup.wait_for_api()
        self.api = RealKubeApi.from_config(str(self.plane.admin_kubeconfig()))
        self.api_version = self.api.server_version()

    @property
    def release(self) -> str:
        assert self.plane is not None
        return self.plane.bins.release

    def stop(self) -> None:
        if self.setup is not None:
            self.setup.close()
        if self.plane is not None:
            self.plane.stop()

    def scheduler_pid(self) -> int:
        assert self.plane is not None
        for component in self.plane.components:
            if component.name == "kube-scheduler" and component.pid is not None:
                return component.pid
        raise KubeError("the scheduler is not running")

    # --- objects --------------------------------------------------------------------------

    def _api(self) -> RealKubeApi:
        assert self.api is not None, "start() first"
        return self.api

    def _setup(self) -> ClusterSetup:
        assert self.setup is not None, "start() first"
        return self.setup

    def parallel(self, action: Callable[[T], object], items: Sequence[T]) -> None:
        """``action`` on every item, ``workers`` at a time (the apiserver takes them at once)."""
        with ThreadPoolExecutor(self.workers) as pool:
            list(pool.map(action, items))

    def create_all(self, objects: Sequence[Obj]) -> None:
        self.parallel(self._api().create, objects)

    def add_nodes(self, names: Sequence[str]) -> None:
        setup = self._setup()
        self.parallel(lambda n: setup.create_node(n, {}), names)

    def delete_slices(self, driver: str) -> None:
        api = self._api()
        found = api.list(RESOURCE_API, "ResourceSlice", field_selector=f"spec.driver={driver}")
        self.parallel(
            lambda s: api.delete(RESOURCE_API, "ResourceSlice", s["metadata"]["name"]),
            found.items,
        )

    def namespace(self, name: str) -> None:
        self._api().create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    # --- a run ----------------------------------------------------------------------------

    def run(
        self,
        workload: str,
        claim_spec: Obj,
        *,
        pods: int,
        timeout_s: float,
        namespace: str | None = None,
    ) -> RunResult:
        """Create ``pods`` gated pods, each with a claim of ``claim_spec``; release them all;
        wait until every pod is bound or ``timeout_s`` passed since the first release."""
        api = self._api()
        namespace = namespace or f"bench-{workload}"
        self.namespace(namespace)
        names = [f"{workload}-{i:04d}" for i in range(pods)]
        self.create_all([_claim(namespace, n, claim_spec) for n in names])
        self.create_all([_gated_pod(namespace, n) for n in names])
        time.sleep(1.0)  # the scheduler's informers see every pod and claim first
        pid = self.scheduler_pid()
        cpu_before = process_cpu_s(pid)
        started = time.monotonic()
        release = threading.Thread(target=self._release, args=(namespace, names), daemon=True)
        release.start()
        bound, unschedulable = 0, 0
        while True:
            time.sleep(0.2)
            bound, unschedulable = _bound(api, namespace)
            elapsed = time.monotonic() - started
            if bound >= pods or elapsed > timeout_s:
                break
        # The last pod's bind time is not observed exactly; the poll adds at most 0.2 s.
        seconds = time.monotonic() - started
        cpu = process_cpu_s(pid) - cpu_before
        release.join()
        return RunResult(workload, pods, bound, seconds, cpu, unschedulable)

    def template_run(
        self, claim_spec: Obj, *, pods: int, timeout_s: float, namespace: str = "bench-templates"
    ) -> tuple[float, float, int]:
        """Pods that each get their claim from one ResourceClaimTemplate, as converted pods do:
        the controller manager creates every claim. Returns (seconds until every claim
        existed, seconds until every pod was bound, pods bound), from the first pod created."""
        api = self._api()
        self.namespace(namespace)
        template = api.create(template_object({"spec": claim_spec}, namespace))["metadata"]["name"]
        names = [f"templated-{i:04d}" for i in range(pods)]
        started = time.monotonic()
        self.create_all([_templated_pod(namespace, n, template) for n in names])
        claimed_at: float | None = None
        bound = 0
        while time.monotonic() - started < timeout_s:
            time.sleep(0.2)
            if claimed_at is None:
                claims = api.list(RESOURCE_API, "ResourceClaim", namespace).items
                if len(claims) >= pods:
                    claimed_at = time.monotonic() - started
            bound, _ = _bound(api, namespace)
            if bound >= pods and claimed_at is not None:
                break
        seconds = time.monotonic() - started
        return (claimed_at if claimed_at is not None else seconds), seconds, bound

    def templated_pod_wait(
        self, namespace: str, claim_spec: Obj, *, timeout_s: float
    ) -> tuple[float, float]:
        """When a pod was created (monotonic) and the seconds from then to its binding, the
        pod naming a template of ``claim_spec`` made a moment before (as the webhook makes
        it); ``timeout_s`` when it was not bound by then."""
        api = self._api()
        name = f"shape-{next(_counter)}"
        template = api.create(template_object({"spec": claim_spec}, namespace))["metadata"]["name"]
        pod = _templated_pod(namespace, name, template)
        started, wall = time.monotonic(), time.time()
        api.create(pod)
        while time.monotonic() - started < timeout_s:
            if api.get("v1", "Pod", name, namespace)["spec"].get("nodeName"):
                # The scheduler's own time of binding (its event, in microseconds): this
                # process may see the binding late while its threads are busy.
                scheduled = _scheduled_at(api, namespace, name)
                seen = time.monotonic() - started
                return started, (scheduled - wall) if scheduled is not None else seen
            time.sleep(0.05)
        return started, timeout_s

    def _release(self, namespace: str, names: Sequence[str]) -> None:
        api = self._api()

        def one(name: str) -> None:
            api.patch(
                "v1",
                "Pod",
                name,
                [{"op": "remove", "path": "/spec/schedulingGates"}],
                namespace=namespace,
                patch_type="json",
            )

        self.parallel(one, names)

    def clear(self, namespace: str, timeout_s: float = 120) -> None:
        """Delete the run's pods (at once: no kubelet would finish a graceful deletion) and
        claims; the controller manager deallocates each claim and lets it go, as in a cluster.
        Returns once every claim is gone, so the next run starts on free devices."""
        api, setup = self._api(), self._setup()
        names = [p["metadata"]["name"] for p in api.list("v1", "Pod", namespace).items]
        self.parallel(
            lambda n: setup.core.delete_namespaced_pod(n, namespace, grace_period_seconds=0), names
        )
        claims = api.list(RESOURCE_API, "ResourceClaim", namespace).items
        self.parallel(lambda c: _delete(api, namespace, c["metadata"]["name"]), claims)
        deadline = time.monotonic() + timeout_s
        while api.list(RESOURCE_API, "ResourceClaim", namespace).items:
            if time.monotonic() > deadline:
                raise KubeError(f"claims of {namespace} still there after {timeout_s:.0f} s")
            time.sleep(0.5)


def _claim(namespace: str, name: str, spec: Obj) -> Obj:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def _gated_pod(namespace: str, name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedulingGates": [{"name": GATE}],
            "resourceClaims": [{"name": "devices", "resourceClaimName": name}],
            "containers": [
                {
                    "name": "app",
                    "image": "registry.example/app:1",
                    "resources": {"claims": [{"name": "devices"}]},
                }
            ],
        },
    }


def _templated_pod(namespace: str, name: str, template: str) -> Obj:
    pod = _gated_pod(namespace, name)
    del pod["spec"]["schedulingGates"]
    pod["spec"]["resourceClaims"] = [{"name": "devices", "resourceClaimTemplateName": template}]
    return pod


def _bound(api: RealKubeApi, namespace: str) -> tuple[int, int]:
    """(pods bound to a node, pods the scheduler last found unschedulable)."""
    bound = unschedulable = 0
    for pod in api.list("v1", "Pod", namespace).items:
        if pod["spec"].get("nodeName"):
            bound += 1
            continue
        for condition in (pod.get("status") or {}).get("conditions") or ():
            if condition.get("type") == "PodScheduled" and condition.get("reason") == (
                "Unschedulable"
            ):
                unschedulable += 1
    return bound, unschedulable


def _delete(api: RealKubeApi, namespace: str, name: str) -> None:
    try:
        api.delete(RESOURCE_API, "ResourceClaim", name, namespace)
    except NotFound:
        pass
