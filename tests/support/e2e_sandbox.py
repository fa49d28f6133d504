"""What the end-to-end tests do with a running sandbox (fixtures are in conftest.py).

Every sandbox runs the webhook and the agents from the package as a plain ``pip install``
installs it (``sandbox up --gpu-slicer``, :mod:`sandbox.install`), made once per test session:
what ships is what the tier exercises. Without the package index (the declared dependencies are
installed from it once, then cached) they run from the test environment, with a note; under
``CI=true`` that is a failure.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpu_slicer.sandbox import launch
from gpu_slicer.sandbox.cluster import api_client
from gpu_slicer.sandbox.errors import BuildError
from gpu_slicer.sandbox.install import install

Obj = dict[str, Any]

NODES = {
    # name: GPUs; each test pins its pods to the node it is about.
    "a100": "A100-80GB:1",  # seven 1g.10gb slices, a 3g.40gb that waits
    "a100-fallback": "A100-80GB:1",  # a fallback chain that takes its second subrequest
    "a100-whole": "A100-80GB:1",  # nvidia.com/gpu: 1 on a MIG-mode GPU
    "h100x4": "H100-80GB:4",  # nvidia.com/gpu: 4
    "h100": "H100-80GB:1",  # gpu-memory annotation, init containers
    "h100-life": "H100-80GB:1",  # deletion, reuse and agent restart
    "one-gpu": "H100-80GB:1",  # an init container and an app container share one GPU
    "quota": "H100-80GB:2",  # a namespace with a GPU quota of 1 runs one GPU pod, not two
    "health": "H100-80GB:2",  # a critical Xid on one GPU reaches its pod's status, not the other's
}
ENABLED = "e2e-enabled"
AUDIT = "e2e-audit"
PLAIN = "e2e-plain"


@dataclass
class Sandbox:
    """A running sandbox and what tests do with it."""

    dir: Path
    ready: Obj
    process: subprocess.Popen[bytes]
    client: k8s.ApiClient

    @property
    def kubeconfig(self) -> Path:
        return Path(self.ready["kubeconfig"])

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.client)

    @property
    def resource(self) -> k8s.ResourceV1Api:
        return k8s.ResourceV1Api(self.client)

    def obj(self, value: Any) -> Obj:
        data: Obj = self.client.sanitize_for_serialization(value)
        return data

    # --- objects -----------------------------------------------------------------------

    def create_pod(self, namespace: str, pod: Obj) -> tuple[Obj, list[str]]:
        """Creates ``pod``; returns the stored pod and the admission warnings of the reply."""
        response = self.core.create_namespaced_pod(namespace, pod, _preload_content=False)
        warnings = (
            response.headers.getlist("Warning") if hasattr(response.headers, "getlist") else []
        )
        return json.loads(response.data), warnings

    def pod(self, namespace: str, name: str) -> Obj:
        return self.obj(self.core.read_namespaced_pod(name, namespace))

    def claims_of(self, pod: Obj) -> list[Obj]:
        names = [
            s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        ]
        return [
            self.obj(self.resource.read_namespaced_resource_claim(n, pod["metadata"]["namespace"]))
            for n in names
            if n
        ]

    def wait(
        self,
        check: Callable[[], Any],
        *,
        what: str,
        timeout_s: float = 60,
        explain: Callable[[], str] | None = None,
    ) -> Any:
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = check()
            except ApiException as exc:
                if exc.status != 404:
                    raise
                last = None
            if last:
                return last
            time.sleep(0.25)
        detail = explain() if explain is not None else ""
        raise AssertionError(
            f"timed out after {timeout_s:.0f} s waiting for {what}\n{detail}{self.diagnose()}"
        )

    def wait_running(self, namespace: str, name: str, timeout_s: float = 60) -> Obj:
        pod: Obj = self.wait(
            lambda: (p := self.pod(namespace, name))["status"].get("phase") == "Running" and p,
            what=f"pod {namespace}/{name} to run",
            timeout_s=timeout_s,
            explain=lambda: self.pod_report(namespace, name),
        )
        return pod

    def pod_report(self, namespace: str, name: str) -> str:
        """Where a pod stands and what happened to it (its status and events), for a failing
        wait."""
        try:
            pod = self.pod(namespace, name)
        except ApiException as exc:
            pod = {"status": {"error": f"cannot read the pod: {exc.status} {exc.reason}"}}
        status, node = pod.get("status", {}), pod.get("spec", {}).get("nodeName")
        events = self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}"
        ).items
        lines = [
            f"{e.type} {e.reason} ({e.source.component if e.source else ''}): {e.message}"
            for e in events
        ]
        report = f"pod status: {json.dumps(status)[-3000:]}\nevents:\n  " + "\n  ".join(lines[-20:])
        for component in ("kubelet", "agent"):  # a real node's logs, where the pod was bound
            path = self.dir / "logs" / f"{component}-{node}.log"
            if node and path.exists():
                tail = path.read_text(errors="replace").splitlines()[-25:]
                report += f"\n{path.name} (tail):\n  " + "\n  ".join(tail)
        return report + "\n"

    def wait_gone(self, namespace: str, name: str, timeout_s: float = 60) -> None:
        def gone() -> bool:
            try:
                self.core.read_namespaced_pod(name, namespace)
            except ApiException as exc:
                return exc.status == 404
            return False

        self.wait(gone, what=f"pod {namespace}/{name} to be gone", timeout_s=timeout_s)

    def delete_pod(self, namespace: str, name: str) -> None:
        self.core.delete_namespaced_pod(name, namespace)
        self.wait_gone(namespace, name)

    def events(self, namespace: str, name: str) -> list[str]:
        listed = self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}"
        )
        return [f"{e.reason}: {e.message}" for e in listed.items]

    # --- what the stand-ins recorded ---------------------------------------------------

    def instances(self, node: str) -> list[tuple[int, str, int]]:
        """(GPU index, profile, placement start) of every MIG instance on the node's GPUs."""
        state = json.loads(Path(self.ready["nodes"][node]["gpuState"]).read_text())
        return sorted(
            (gpu["index"], i["profile"], i["start"])
            for gpu in state["gpus"]
            for i in gpu["instances"]
        )

    def mig_modes(self, node: str) -> list[bool]:
        state = json.loads(Path(self.ready["nodes"][node]["gpuState"]).read_text())
        return [bool(gpu["migCurrent"]) for gpu in state["gpus"]]

    def container_runtime(self, node: str, namespace: str, pod: str, container: str) -> Obj:
        path = Path(self.ready["nodes"][node]["runtime"]) / f"{namespace}_{pod}_{container}.json"
        data: Obj = json.loads(path.read_text())
        return data

    def pid(self, component: str) -> int:
        ready = json.loads((self.dir / "ready").read_text())
        return int(ready["pids"][component])

    def reboot(self, node: str, timeout_s: float = 180) -> None:
        """Reboots the real ``node`` (``reboot/``): back when the sandbox took the request."""
        request = self.dir / "reboot" / node
        request.write_text("")
        self.wait(lambda: not request.exists(), what=f"{node} rebooted", timeout_s=timeout_s)

    def pause(self, component: str) -> None:
        """Stops ``component`` and keeps it stopped (``paused/``) until :meth:`resume`; back
        once its process has exited, not when it stops listening: a stopping webhook still
        answers on the apiserver's open connections for a while (webhook.worker.DRAIN_S)."""
        old = self.pid(component)
        (self.dir / "paused" / component).write_text("")
        self.wait(lambda: not _alive(old), what=f"{component} stopped")

    def resume(self, component: str) -> None:
        (self.dir / "paused" / component).unlink(missing_ok=True)

    def restart(self, component: str) -> None:
        """Stops ``component`` (``paused/``) and lets the sandbox start it again."""
        old = self.pid(component)
        self.pause(component)
        self.resume(component)
        self.wait(lambda: self.pid(component) != old, what=f"{component} restarted")

    def log(self, component: str) -> str:
        return (self.dir / "logs" / f"{component}.log").read_text(errors="replace")

    def simulate_event(self, node: str, *flags: str) -> None:
        """``gpu-slicer agent simulate-event`` on the node's simulated GPUs, as an operator would
        inject a fault (``--gpu 0 --xid 79``) or its recovery (``--gpu 0 --recovered``)."""
        state = self.ready["nodes"][node]["gpuState"]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpu_slicer.cli.main",
                "agent",
                "simulate-event",
                "--simulate-state",
                state,
            ]
            + list(flags),
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr

    def diagnose(self) -> str:
        """The tail of the sandbox's own output, for a failing wait."""
        out = launch.output_of(self.dir)
        text = out.read_text(errors="replace") if out.exists() else ""
        return "sandbox output (tail):\n" + "\n".join(text.splitlines()[-15:])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def resource_health(pod: Obj) -> list[Obj]:
    """The single container's ``allocatedResourcesStatus``: what the kubelet heard from the
    drivers' resource-health streams (empty until it first reports)."""
    [status] = pod["status"].get("containerStatuses") or [{}]
    entries: list[Obj] = status.get("allocatedResourcesStatus") or []
    return entries


def pod_manifest(
    name: str,
    *,
    node: str | None = None,
    limits: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    init: list[Obj] | None = None,
) -> Obj:
    """A pod with one container (``main``) asking for ``limits``, pinned to ``node``."""
    spec: Obj = {
        "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits or {}}}],
        "terminationGracePeriodSeconds": 0,
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if init:
        spec["initContainers"] = init
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}, "labels": labels or {}},
        "spec": spec,
    }


@functools.cache
def shipped_command() -> list[str]:
    """``--gpu-slicer <fresh install>/bin/gpu-slicer`` once per session; empty without the
    package index, outside CI."""
    folder = Path(tempfile.mkdtemp(prefix="gs-shipped-"))
    atexit.register(shutil.rmtree, folder, True)
    try:
        venv = install(folder / "venv", progress=lambda m: print(f"[e2e] {m}", file=sys.__stderr__))
    except BuildError as exc:
        if os.environ.get("CI", "").lower() == "true":
            raise
        print(f"[e2e] components run from the test environment: {exc}", file=sys.__stderr__)
        return []
    return ["--gpu-slicer", str(venv / "bin" / "gpu-slicer")]


def start_sandbox(folder: Path, nodes: dict[str, str], *extra: str) -> Sandbox:
    """``gpu-slicer sandbox up`` in a subprocess, until its ``ready`` file appears."""
    process = launch.launch(folder, nodes, *shipped_command(), *extra)
    ready = launch.wait_ready(folder, process)
    return Sandbox(folder, ready, process, api_client(Path(ready["kubeconfig"])))


def stop_sandbox(process: subprocess.Popen[bytes]) -> int:
    return launch.stop(process)


def assert_stopped_cleanly(code: int, folder: Path) -> None:
    """``sandbox up`` exited 0 and left no process that names its state folder."""
    assert code == 0, f"sandbox up exited {code}"
    leftovers = subprocess.run(["pgrep", "-f", str(folder)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", f"processes left behind: {leftovers.stdout}"


def wait_webhook_knows(box: Sandbox) -> None:
    probe = pod_manifest("probe", limits={"nvidia.com/mig-1g.10gb": "1"})

    def converted() -> bool:
        created = box.core.create_namespaced_pod(ENABLED, probe, dry_run="All")
        return bool(created.spec.resource_claims)

    box.wait(converted, what="the webhook to see the opted-in namespace", timeout_s=60)


def start_with_enabled_namespace(prefix: str, nodes: dict[str, str], *extra: str) -> Sandbox:
    """A sandbox of its own for one test module, with ENABLED opted in and the webhook aware."""
    import tempfile

    running = start_sandbox(Path(tempfile.mkdtemp(prefix=prefix)) / "sb", nodes, *extra)
    running.core.create_namespace(
        {"metadata": {"name": ENABLED, "labels": {"gpu-slicer.io/migration": "enabled"}}}
    )
    wait_webhook_knows(running)
    return running


@contextlib.contextmanager
def chart_pods_sandbox(prefix: str, node: str, gpus: str, *install: str) -> Iterator[Sandbox]:
    """A sandbox of its own whose real ``node`` runs the chart's pods from the image built from
    the Dockerfile (``install``: ``--agent-pod``, ``--webhook-pod``). Skipped with the reason
    where the machine cannot run containers or the parts cannot be built, a failure under
    ``CI=true``. On the way out the sandbox must stop cleanly and leave no process behind."""
    from pytest import fail, skip

    from gpu_slicer.sandbox import binaries, image, node_host, realnode

    def unavailable(reason: str) -> None:
        if os.environ.get("CI", "").lower() == "true":
            fail(f"the chart's pods cannot run here: {reason}")
        skip(f"no chart pods on a real node: {reason}")

    folder = Path(tempfile.mkdtemp(prefix=prefix)) / "sb"
    problems = node_host.preflight(folder)
    if problems:
        unavailable("; ".join(problems))
    progress = lambda m: print(f"[e2e] {m}", file=sys.__stderr__, flush=True)  # noqa: E731
    try:
        realnode.ensure_parts(binaries.DEFAULT_MINOR, progress=progress)
        image.ensure(progress=progress)
    except (BuildError, image.ImageToolsMissing) as exc:
        unavailable(str(exc))
    running = start_sandbox(
        folder, {node: gpus}, "--real-node", node, "--install", "helm", *install
    )
    try:
        yield running
    finally:
        running.client.close()
        code = stop_sandbox(running.process)
    assert_stopped_cleanly(code, folder)
    shutil.rmtree(folder.parent)
