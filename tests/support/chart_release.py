"""The chart's release on a real-node sandbox, as the day-two tests read and drive it: helm
and kubectl against the sandbox, the chart's pods and their logs, and what the agent leaves on
the node (its claims' CDI files and checkpoint entries)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from gpu_slicer.core.identity import DRIVERS
from gpu_slicer.sandbox.chart_pods import WEBHOOK_ENDPOINTS_SELECTOR
from gpu_slicer.sandbox.helm import helm_binary
from tests.support.e2e_sandbox import Obj, Sandbox

RELEASE_NAMESPACE = "gpu-slicer"


def helm(box: Sandbox, *args: str) -> subprocess.CompletedProcess[str]:
    """``helm`` on the release's namespace of the sandbox's cluster."""
    return subprocess.run(
        [
            str(helm_binary()),
            *args,
            "--namespace",
            RELEASE_NAMESPACE,
            "--kubeconfig",
            str(box.kubeconfig),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def run_kubectl(
    box: Sandbox, binary: Path, *args: str, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """``kubectl`` (the ``kubectl`` fixture's ``binary``) against the sandbox's cluster, as its
    admin runs it; the test reads the outcome."""
    return subprocess.run(
        [str(binary), "--kubeconfig", str(box.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def release_pods(box: Sandbox, component: str) -> list[Obj]:
    listed = box.core.list_namespaced_pod(
        RELEASE_NAMESPACE, label_selector=f"app.kubernetes.io/component={component}"
    ).items
    return [box.obj(p) for p in listed]


def pod_log(box: Sandbox, pod: Obj) -> str:
    return str(box.core.read_namespaced_pod_log(pod["metadata"]["name"], RELEASE_NAMESPACE))


def cdi_claims(box: Sandbox, node: str) -> list[str]:
    """The claims' CDI files the agent wrote on the node (its own spec files only)."""
    return sorted(
        p.name for p in (box.dir / "nodes" / node / "cdi").glob("k8s.gpu-slicer.io-claim_*")
    )


def checkpoint_claims(box: Sandbox, node: str) -> dict[str, Any]:
    path = box.dir / "nodes" / node / "checkpoint" / "checkpoint.json"
    claims: dict[str, Any] = json.loads(path.read_text())["data"]["claims"]  # the envelope
    return claims


def driver_claims(box: Sandbox) -> list[str]:
    """Claims in every namespace with a device of gpu-slicer's driver (either name) allocated."""
    return sorted(
        f"{c.metadata.namespace}/{c.metadata.name}"
        for c in box.resource.list_resource_claim_for_all_namespaces().items
        if c.status
        and c.status.allocation
        and any(r.driver in DRIVERS for r in c.status.allocation.devices.results)
    )


def started(box: Sandbox, namespace: str, name: str) -> tuple[str, int, str]:
    """A pod's container id, restart count and phase: unchanged while it is undisturbed."""
    pod = box.pod(namespace, name)
    [status] = pod["status"]["containerStatuses"]
    return status["containerID"], status["restartCount"], pod["status"]["phase"]


WEBHOOK_NAME = "pods.gpu-slicer.io"
"""The webhook's name in the chart's MutatingWebhookConfiguration."""
FAIL_OPEN = "apiserver_admission_webhook_fail_open_count"
"""The apiserver's count of admissions it let through because a webhook call failed
(``failurePolicy: Ignore``), by webhook name."""


@dataclass(frozen=True)
class Failure:
    """One admission that was not converted: the pod's name, what came back, and when it was
    sent and answered (``time.time()``)."""

    name: str
    what: str
    sent: float
    answered: float

    def __str__(self) -> str:
        return (
            f"{self.name}: {self.what} (sent {_clock(self.sent)}, answered {_clock(self.answered)})"
        )


@dataclass
class Stop:
    """A webhook pod seen terminating: its release, and when the watch first and last saw it
    terminating (it is gone after that)."""

    tag: str
    terminating: float
    last_seen: float


@dataclass
class AdmissionCount:
    """Pods sent for admission (server-side dry run, so nothing is created) while the release
    changes, the way workloads keep arriving during a rollout: how many the webhook converted,
    and every failure with the apiserver's message and the time it was sent.

    Beside them it keeps a timeline of the webhook's pods (image, ready, terminating) and of its
    Service's endpoints as a client sees them every 0.1 s, each pod's stop, and how many
    admissions the apiserver failed open meanwhile, so that a failure can be read against the
    rollout: which pod was stopping, and whether the webhook answered at all."""

    box: Sandbox
    namespace: str
    limits: dict[str, str]
    converted: int = 0
    failures: list[Failure] = field(default_factory=list)
    timeline: list[tuple[float, str]] = field(default_factory=list)
    stops: dict[str, Stop] = field(default_factory=dict)
    failed_open: int = 0
    _failed_open_before: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> AdmissionCount:
        self._failed_open_before = fail_open_count(self.box)
        self._threads = [
            threading.Thread(target=run, daemon=True) for run in (self._send, self._watch)
        ]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        self.failed_open = fail_open_count(self.box) - self._failed_open_before

    def _send(self) -> None:
        number = 0
        while not self._stop.is_set():
            number += 1
            name = f"admission-{number}"
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "resources": {"limits": self.limits},
                        }
                    ]
                },
            }
            sent = time.time()
            try:
                made = self.box.core.create_namespaced_pod(self.namespace, pod, dry_run="All")
            except ApiException as exc:
                what = f"{exc.status}: {exc.body or exc.reason}"
                self.failures.append(Failure(name, what, sent, time.time()))
            else:
                if made.spec.resource_claims:
                    self.converted += 1
                else:
                    self.failures.append(Failure(name, "admitted unconverted", sent, time.time()))
            self._stop.wait(0.1)

    def _watch(self) -> None:
        """A line in the timeline each time what the webhook runs on changes."""
        last = ""
        while not self._stop.is_set():
            at = time.time()
            try:
                pods, endpoints = _webhook_state(self.box)
            except ApiException as exc:
                now = f"unreadable: {exc.status}"
            else:
                for name, tag, state in pods:
                    if state == "terminating":
                        self.stops.setdefault(name, Stop(tag, at, at)).last_seen = at
                shown = "; ".join(sorted(" ".join(pod) for pod in pods))
                now = f"pods [{shown}] endpoints [{'; '.join(sorted(endpoints))}]"
            if now != last:
                self.timeline.append((at, now))
                last = now
            self._stop.wait(0.1)

    def outside_stops_of(self, tag: str) -> list[Failure]:
        """The failures that no stop of a ``tag`` webhook pod explains: a failure is explained
        when it was sent or answered between the pod's being seen terminating and its being
        seen gone (each known to the watch's 0.1 s)."""
        windows = [
            (stop.terminating - 0.2, stop.last_seen + 0.2)
            for stop in self.stops.values()
            if stop.tag == tag
        ]
        return [
            f
            for f in self.failures
            if not any(start <= f.answered and f.sent <= end for start, end in windows)
        ]

    def report(self) -> str:
        """The failures, the apiserver's fail-open count, then the timeline and what the
        apiserver logged about failing open: what an assertion on them says."""
        lines = [str(f) for f in self.failures]
        lines.append(f"failed open by the apiserver meanwhile: {self.failed_open}")
        lines.append("the webhook's pods and endpoints:")
        lines += [f"  {_clock(at)} {state}" for at, state in self.timeline]
        if self.failures:
            lines.append("the apiserver's log on failing open:")
            lines += [f"  {line}" for line in _failing_open_log(self.box)[-10:]]
        return "\n".join(lines)


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1000):03d}"


def _webhook_state(box: Sandbox) -> tuple[list[tuple[str, str, str]], list[str]]:
    """Each webhook pod (name, its image's tag, ready / not ready / terminating) and each
    endpoint of its Service (address:port and its conditions)."""
    pods = []
    for pod in release_pods(box, "webhook"):
        tag = pod["spec"]["containers"][0]["image"].rpartition(":")[2]
        ready = any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in pod["status"].get("conditions") or ()
        )
        state = (
            "terminating"
            if pod["metadata"].get("deletionTimestamp")
            else ("ready" if ready else "not ready")
        )
        pods.append((pod["metadata"]["name"], tag, state))
    endpoints = []
    slices = (
        k8s.DiscoveryV1Api(box.client)
        .list_namespaced_endpoint_slice(
            RELEASE_NAMESPACE, label_selector=WEBHOOK_ENDPOINTS_SELECTOR
        )
        .items
    )
    for s in slices:
        ports = ",".join(str(p.port) for p in s.ports or ())
        for e in s.endpoints or ():
            c = e.conditions
            flags = [n for n in ("ready", "serving", "terminating") if c and getattr(c, n)]
            endpoints.append(f"{','.join(e.addresses)}:{ports} {'/'.join(flags) or 'none'}")
    return pods, endpoints


def fail_open_count(box: Sandbox) -> int:
    """How many admissions the apiserver has let through after a failed call to gpu-slicer's
    webhook, from its own metrics."""
    request = box.client.param_serialize(
        method="GET",
        resource_path="/metrics",
        header_params={"Accept": "text/plain"},
        auth_settings=["BearerToken"],
    )
    reply = box.client.call_api(*request)
    reply.read()
    text = reply.data.decode()
    return sum(
        int(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if family.name == FAIL_OPEN and sample.labels.get("name") == WEBHOOK_NAME
    )


def _failing_open_log(box: Sandbox) -> list[str]:
    return [line for line in box.log("kube-apiserver").splitlines() if "failing open" in line]
