"""A kubelet stand-in: what the kubelet's DRA manager does for the pods of one node.

It does no more and no less than the kubelet does with DRA drivers (pkg/kubelet/cm/dra and the
plugin manager), and runs no containers:

* **Registration.** It watches the plugin registry folder. For each socket it calls
  ``Registration.GetInfo``, accepts ``type == "DRAPlugin"`` with a supported version
  (``v1.DRAPlugin``, else ``v1beta1.DRAPlugin``), takes the endpoint, and answers
  ``NotifyRegistrationStatus`` (registered, or not with the reason). A socket that is replaced
  (an agent restarted) is registered again; one that disappears is forgotten.
* **Prepare, before a pod starts.** For a pod bound to its node it resolves each pod claim's
  ResourceClaim name (``resourceClaimName``, or for a template the entry in
  ``status.resourceClaimStatuses``, and the KEP-5004 ``extendedResourceClaimStatus``), reads the
  claim, refuses one that is not allocated or not reserved for the pod, groups claims by the
  drivers in their allocation and calls ``NodePrepareResources`` per driver. A per-claim error
  or a missing answer fails the attempt; it is retried, as the kubelet's pod workers do.
* **CDI.** It hands each container the CDI device ids of the claim requests it references and
  injects them into an OCI runtime spec with the reference CDI library (``cdi-inject``); a spec
  the library refuses fails the pod's start. The resulting spec is written to
  ``<runtime dir>/<namespace>_<pod>_<container>.json``. Then it reports the pod Running.
* **Unprepare, after a pod stops.** For a pod being deleted it stops the "containers", calls
  ``NodeUnprepareResources`` for each claim no other pod on the node still uses, then finishes
  the deletion (grace period 0, UID precondition), so the claim controller releases the claim.
  A pod that disappears without that (force-deleted) has its claims unprepared the same way.
* **Resource health (1.36 and newer).** It watches each registered driver's
  ``NodeWatchResources`` stream and writes the health of each container's prepared devices into
  the pod's ``containerStatuses[].allocatedResourcesStatus`` when it changes, as the kubelet does
  (:mod:`sandbox.kubelet_health`).

It authenticates as the node (``system:node:<name>``), so the Node authorizer decides what it
may read, as for a real kubelet.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from gpu_slicer.sandbox.cluster import serialize
from gpu_slicer.sandbox.kubelet_health import (
    AllocatedDevice,
    DeviceKey,
    HealthCache,
    HealthWatch,
    pod_resource_status,
    pods_holding,
)
from gpu_slicer.slicer.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

log = logging.getLogger(__name__)

SUPPORTED = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
"""What this kubelet speaks, preferred first (the kubelet of 1.34+)."""
RPC_TIMEOUT_S = 45.0
Obj = dict[str, Any]


class PodNotReady(Exception):
    """The pod cannot start yet; the message says why. Retried."""


@dataclass
class Plugin:
    name: str
    endpoint: str
    version: str
    socket_id: tuple[int, float]

    def prepare_stub(self) -> tuple[Any, Any, grpc.Channel]:
        channel = grpc.insecure_channel(f"unix://{self.endpoint}")
        pb: ModuleType = dra_v1_pb2
        services: ModuleType = dra_v1_pb2_grpc
        if self.version != "v1.DRAPlugin":
            pb, services = dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
        stub = services.DRAPluginStub(channel)
        return pb, stub, channel


@dataclass
class PreparedClaim:
    namespace: str
    name: str
    drivers: set[str]
    pods: set[str] = field(default_factory=set)
    cdi_ids: dict[str, list[str]] = field(default_factory=dict)
    """Base request name -> CDI device ids."""
    devices: list[AllocatedDevice] = field(default_factory=list)
    """What NodePrepareResources answered, device by device (for resource health)."""


class Registrar:
    """The plugin watcher: registers the DRA drivers whose sockets appear in the registry."""

    def __init__(self, registry_dir: Path) -> None:
        self.registry_dir = registry_dir
        self.plugins: dict[str, Plugin] = {}
        self.registrations = 0
        self._lock = threading.Lock()

    def scan(self) -> None:
        seen: set[str] = set()
        for path in sorted(self.registry_dir.glob("*.sock")):
            try:
                stat = path.stat()
            except OSError:
                continue
            socket_id = (stat.st_ino, stat.st_mtime)
            seen.add(str(path))
            known = [p for p in self.plugins.values() if p.socket_id == socket_id]
            if known:
                continue
            self._register(path, socket_id)
        with self._lock:
            for name, plugin in list(self.plugins.items()):
                if plugin.socket_id and not any(
                    _same_socket(Path(s), plugin.socket_id) for s in seen
                ):
                    log.info("DRA plugin socket gone", extra={"driver": name})
                    del self.plugins[name]

    def _register(self, path: Path, socket_id: tuple[int, float]) -> None:
        channel = grpc.insecure_channel(f"unix://{path}")
        try:
            stub = pluginregistration_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            info = stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=5)
            problem = None
            version = next((v for v in SUPPORTED if v in info.supported_versions), None)
            if info.type != "DRAPlugin":
                problem = f"plugin type {info.type!r} is not DRAPlugin"
            elif version is None:
                problem = (
                    f"none of the versions {list(info.supported_versions)} is supported "
                    f"(kubelet speaks {', '.join(SUPPORTED)})"
                )
            stub.NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(
                    plugin_registered=problem is None, error=problem or ""
                ),
                timeout=5,
            )
            if problem is not None:
                log.warning("DRA plugin refused", extra={"socket": str(path), "problem": problem})
                return
            assert version is not None
            with self._lock:
                self.plugins[info.name] = Plugin(
                    info.name, info.endpoint or str(path), version, socket_id
                )
                self.registrations += 1
            log.info(
                "DRA plugin registered",
                extra={"driver": info.name, "endpoint": info.endpoint, "version": version},
            )
        except grpc.RpcError as exc:
            log.debug(
                "registration socket not answering yet",
                extra={"socket": str(path), "error": str(exc)},
            )
        finally:
            channel.close()

    def get(self, driver: str) -> Plugin | None:
        with self._lock:
            return self.plugins.get(driver)


def _same_socket(path: Path, socket_id: tuple[int, float]) -> bool:
    try:
        stat = path.stat()
    except OSError:
        return False
    return (stat.st_ino, stat.st_mtime) == socket_id


def claim_names(pod: Obj) -> list[tuple[str, str | None]]:
    """(pod claim name, ResourceClaim name or None when not created yet) for each pod claim.

    A template's entry in ``resourceClaimStatuses`` with no ``resourceClaimName`` means no
    claim was needed; such entries are left out.
    """
    statuses = {s["name"]: s for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    found: list[tuple[str, str | None]] = []
    for pod_claim in pod["spec"].get("resourceClaims") or []:
        name = pod_claim["name"]
        if pod_claim.get("resourceClaimName"):
            found.append((name, pod_claim["resourceClaimName"]))
        elif name in statuses:
            if statuses[name].get("resourceClaimName"):
                found.append((name, statuses[name]["resourceClaimName"]))
        else:
            found.append((name, None))
    extended = (pod.get("status") or {}).get("extendedResourceClaimStatus")
    if extended and extended.get("resourceClaimName"):
        found.append(("", extended["resourceClaimName"]))
    return found


def base_request(name: str) -> str:
    """``gpu/small`` (a subrequest chosen by the allocator) -> ``gpu``."""
    return name.split("/", 1)[0]


def container_device_ids(
    pod: Obj, container: Obj, prepared: dict[str, PreparedClaim], names: dict[str, str]
) -> list[str]:
    """The CDI ids a container gets: the devices of the claims (and requests) it references."""
    ids: list[str] = []
    for ref in (container.get("resources") or {}).get("claims") or []:
        claim_name = names.get(ref["name"])
        claim = prepared.get(claim_name or "")
        if claim is None:
            continue
        for request, devices in claim.cdi_ids.items():
            if not ref.get("request") or base_request(ref["request"]) == request:
                ids += [d for d in devices if d not in ids]
    extended = (pod.get("status") or {}).get("extendedResourceClaimStatus")
    if extended and extended.get("resourceClaimName") in prepared:
        claim = prepared[extended["resourceClaimName"]]
        for mapping in extended.get("requestMappings") or []:
            if mapping.get("containerName") == container["name"]:
                ids += [d for d in claim.cdi_ids.get(mapping["requestName"], []) if d not in ids]
    return ids


class KubeletStandIn:
    """One node's kubelet, as far as DRA goes; :meth:`start` runs it on threads."""

    def __init__(
        self,
        node: str,
        *,
        api: k8s.ApiClient,
        registry_dir: Path,
        cdi_dirs: list[Path],
        cdi_inject: Path | None,
        runtime_dir: Path,
        retry_s: float = 0.5,
        on_error: Callable[[str], None] | None = None,
        watch_health: bool = True,
    ) -> None:
        self.node = node
        self.core = k8s.CoreV1Api(api)
        self.resource = k8s.ResourceV1Api(api)
        self.api = api
        self.registrar = Registrar(registry_dir)
        self.cdi_dirs = cdi_dirs
        self.cdi_inject = cdi_inject
        self.runtime_dir = runtime_dir
        self.retry_s = retry_s
        self.on_error = on_error or (lambda _message: None)
        self.claims: dict[str, PreparedClaim] = {}
        """Claim uid -> what was prepared and for which pods."""
        self.started: dict[str, Obj] = {}
        """Pod uid -> the pod as last seen, for the pods this kubelet started."""
        self._not_before: dict[str, float] = {}
        self._reported: dict[str, str] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.watch_health = watch_health
        self.health = HealthCache()
        self.health_watches: dict[str, tuple[tuple[int, float], HealthWatch]] = {}
        """Driver -> (its registration socket, its health stream)."""
        self._health_changes: list[tuple[str, list[DeviceKey]]] = []
        self._health_lock = threading.Lock()

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self.runtime_dir.mkdir(parents=True, exist_ok=True)
        for name, target in (("watch", self._watch_pods), ("sync", self._sync_loop)):
            thread = threading.Thread(
                target=target, name=f"kubelet-{self.node}-{name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Ends the sync loop; the watch thread, blocked in a stream read, is a daemon and ends
        with the process (or at its next event)."""
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            if not thread.name.endswith("-watch"):
                thread.join(timeout=10)
        for _, watch in self.health_watches.values():
            watch.stop()
        self.health_watches.clear()

    def _watch_pods(self) -> None:
        while not self._stop.is_set():
            try:
                stream = k8s_watch.Watch().stream(  # type: ignore[no-untyped-call]
                    self.core.list_pod_for_all_namespaces,
                    field_selector=f"spec.nodeName={self.node}",
                    timeout_seconds=30,
                    _request_timeout=40,
                )
                for _event in stream:
                    self._wake.set()
                    if self._stop.is_set():
                        return
            except Exception:  # the apiserver restarting or a dropped stream: watch again
                self._stop.wait(1.0)

    def _sync_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            try:
                self.registrar.scan()
                self._sync_health_watches()
                self.sync()
            except Exception as exc:  # keep the kubelet alive; the next pass retries
                log.warning("kubelet sync failed", extra={"node": self.node, "error": str(exc)})

    # --- one pass ------------------------------------------------------------------------

    def sync(self) -> None:
        """Level-triggered: bring every pod of the node to where it should be."""
        listed = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}")
        pods = [serialize(self.api, p) for p in listed.items]
        live = {p["metadata"]["uid"] for p in pods}
        for pod in pods:
            uid = pod["metadata"]["uid"]
            if pod["metadata"].get("deletionTimestamp"):
                self._terminate(pod)
            elif uid not in self.started and (pod.get("status") or {}).get("phase") in (
                None,
                "Pending",
                "Running",
            ):
                if time.monotonic() >= self._not_before.get(uid, 0.0):
                    self._try_start(pod)
        known = (
            set(self.started)
            | set(self._not_before)
            | set(self._reported)
            | {u for c in self.claims.values() for u in c.pods}
        )
        for uid in known - live:
            self._forget(uid)
        self._sync_health_status({p["metadata"]["uid"]: p for p in pods})

    def _try_start(self, pod: Obj) -> None:
        uid = pod["metadata"]["uid"]
        try:
            names = self._prepare(pod)
            self._run_containers(pod, names)
        except PodNotReady as exc:
            self._not_before[uid] = time.monotonic() + self.retry_s
            self._report(pod, "FailedPrepareDynamicResources", str(exc))
            return
        self.started[uid] = pod
        self._not_before.pop(uid, None)
        self._mark_running(pod)

    def _prepare(self, pod: Obj) -> dict[str, str]:
        """Prepares the pod's claims; returns pod claim name -> ResourceClaim name."""
        namespace, uid = pod["metadata"]["namespace"], pod["metadata"]["uid"]
        names: dict[str, str] = {}
        by_driver: dict[str, list[Obj]] = {}
        for pod_claim, claim_name in claim_names(pod):
            if claim_name is None:
                raise PodNotReady(
                    f"the ResourceClaim of pod claim {pod_claim!r} is not created yet"
                )
            try:
                claim = serialize(
                    self.api, self.resource.read_namespaced_resource_claim(claim_name, namespace)
                )
            except ApiException as exc:
                raise PodNotReady(
                    f"cannot read ResourceClaim {namespace}/{claim_name}: {exc.status} {exc.reason}"
                ) from None
            status = claim.get("status") or {}
            if not any(r.get("uid") == uid for r in status.get("reservedFor") or []):
                raise PodNotReady(
                    f"ResourceClaim {namespace}/{claim_name} is not reserved for this pod"
                )
            results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
            names[pod_claim] = claim_name
            for driver in {r["driver"] for r in results}:
                by_driver.setdefault(driver, []).append(claim)
        for driver, claims in sorted(by_driver.items()):
            self._prepare_with(driver, claims, uid)
        return names

    def _prepare_with(self, driver: str, claims: list[Obj], pod_uid: str) -> None:
        plugin = self.registrar.get(driver)
        if plugin is None:
            raise PodNotReady(f"DRA driver {driver} is not registered on node {self.node}")
        pb, stub, channel = plugin.prepare_stub()
        request = pb.NodePrepareResourcesRequest(
            claims=[
                pb.Claim(
                    namespace=c["metadata"]["namespace"],
                    uid=c["metadata"]["uid"],
                    name=c["metadata"]["name"],
                )
                for c in claims
            ]
        )
        try:
            response = stub.NodePrepareResources(request, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as exc:
            raise PodNotReady(
                f"NodePrepareResources on {driver}: {exc.code().name}: {exc.details()}"
            ) from None
        finally:
            channel.close()
        for claim in claims:
            claim_uid = claim["metadata"]["uid"]
            if claim_uid not in response.claims:
                raise PodNotReady(
                    f"{driver} returned no result for claim {claim['metadata']['name']}"
                )
            answer = response.claims[claim_uid]
            if answer.error:
                raise PodNotReady(
                    f"{driver} could not prepare claim {claim['metadata']['name']}: {answer.error}"
                )
            entry = self.claims.setdefault(
                claim_uid,
                PreparedClaim(claim["metadata"]["namespace"], claim["metadata"]["name"], set()),
            )
            entry.drivers.add(driver)
            entry.pods.add(pod_uid)
            for device in answer.devices:
                allocated = AllocatedDevice(
                    driver,
                    device.pool_name,
                    device.device_name,
                    tuple(base_request(r) for r in device.request_names),
                    tuple(device.cdi_device_ids),
                )
                if allocated not in entry.devices:
                    entry.devices.append(allocated)
                for request in device.request_names:
                    ids = entry.cdi_ids.setdefault(base_request(request), [])
                    ids += [i for i in device.cdi_device_ids if i not in ids]

    def _run_containers(self, pod: Obj, names: dict[str, str]) -> None:
        """Each container's CDI devices injected into its OCI spec, as the runtime would."""
        prepared = {c.name: c for c in self.claims.values() if pod["metadata"]["uid"] in c.pods}
        spec = pod["spec"]
        for container in (spec.get("initContainers") or []) + spec["containers"]:
            ids = container_device_ids(pod, container, prepared, names)
            record: Obj = {
                "pod": pod["metadata"]["name"],
                "container": container["name"],
                "cdiDevices": ids,
            }
            if ids and self.cdi_inject is not None:
                record.update(self._inject(ids))
            path = self.runtime_dir / (
                f"{pod['metadata']['namespace']}_{pod['metadata']['name']}_{container['name']}.json"
            )
            path.write_text(json.dumps(record, indent=2))

    def _inject(self, ids: list[str]) -> Obj:
        assert self.cdi_inject is not None
        command = [str(self.cdi_inject), "--stand-in-missing-device-nodes"]
        for folder in self.cdi_dirs:
            command += ["--spec-dir", str(folder)]
        result = subprocess.run(command + ids, capture_output=True, text=True, timeout=60)
        try:
            output: Obj = json.loads(result.stdout)
        except json.JSONDecodeError:
            output = {"error": result.stderr.strip() or f"exit {result.returncode}"}
        if output.get("error"):
            message = f"CDI injection of {', '.join(ids)} failed: {output['error']}" + "".join(
                f"\n  {e}" for e in output.get("specErrors") or []
            )
            self.on_error(message)
            raise PodNotReady(message)
        return {
            "ociSpec": output["spec"],
            "standInDeviceNodes": output.get("standInDeviceNodes") or [],
        }

    def _mark_running(self, pod: Obj) -> None:
        now = _now()
        spec = pod["spec"]
        resource_status = self._resource_status(pod)
        conditions = [
            {"type": t, "status": "True", "lastTransitionTime": now}
            for t in (
                "PodReadyToStartContainers",
                "Initialized",
                "Ready",
                "ContainersReady",
                "PodScheduled",
            )
        ]
        status = {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": now,
            "conditions": conditions,
            "initContainerStatuses": [
                _container_status(c, now, done=True) for c in spec.get("initContainers") or []
            ],
            "containerStatuses": [
                _container_status(c, now, done=False, resources=resource_status.get(c["name"]))
                for c in spec["containers"]
            ],
        }
        try:
            self.core.patch_namespaced_pod_status(
                pod["metadata"]["name"], pod["metadata"]["namespace"], {"status": status}
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    # --- resource health -----------------------------------------------------------------

    def _sync_health_watches(self) -> None:
        """A health stream per registered plugin; a replaced or gone plugin's stream stops."""
        if not self.watch_health:
            return
        plugins = dict(self.registrar.plugins)
        for driver, (socket_id, watch) in list(self.health_watches.items()):
            plugin = plugins.get(driver)
            if plugin is None or plugin.socket_id != socket_id:
                watch.stop()
                del self.health_watches[driver]
        for driver, plugin in plugins.items():
            if driver not in self.health_watches:
                watch = HealthWatch(driver, plugin.endpoint, self.health, self._health_changed)
                watch.start()
                self.health_watches[driver] = (plugin.socket_id, watch)

    def _health_changed(self, driver: str, changed: list[DeviceKey]) -> None:
        """From a stream's thread: remember the change, let the sync loop update the pods."""
        with self._health_lock:
            self._health_changes.append((driver, changed))
        self._wake.set()

    def _resource_status(self, pod: Obj) -> dict[str, list[Obj]]:
        if not self.watch_health:
            return {}
        uid = pod["metadata"]["uid"]
        claims = {c.name: c.devices for c in self.claims.values() if uid in c.pods}
        return pod_resource_status(pod, claims, self.health.get)

    def _sync_health_status(self, live: dict[str, Obj]) -> None:
        """The status of each running pod that holds a device whose health changed."""
        with self._health_lock:
            changes, self._health_changes = self._health_changes, []
        claims = [(c.pods, c.devices) for c in self.claims.values()]
        affected: set[str] = set()
        for driver, changed in changes:
            affected |= pods_holding(claims, driver, changed)
        for uid in sorted(affected):
            if uid in self.started and uid in live:
                self._write_resource_status(live[uid])

    def _write_resource_status(self, listed: Obj) -> None:
        meta = listed["metadata"]
        try:  # as it is now: the list may predate this pass's own status write
            pod = serialize(
                self.api, self.core.read_namespaced_pod(meta["name"], meta["namespace"])
            )
        except ApiException as exc:
            if exc.status != 404:
                self.on_error(f"cannot read pod {meta['namespace']}/{meta['name']}: {exc.reason}")
            return
        statuses = [dict(s) for s in (pod.get("status") or {}).get("containerStatuses") or []]
        if not statuses:
            return
        resource_status = self._resource_status(pod)
        for status in statuses:
            found = resource_status.get(status["name"])
            if found:
                status["allocatedResourcesStatus"] = found
            else:
                status.pop("allocatedResourcesStatus", None)
        try:
            self.core.patch_namespaced_pod_status(
                pod["metadata"]["name"],
                pod["metadata"]["namespace"],
                {"status": {"containerStatuses": statuses}},
            )
        except ApiException as exc:
            if exc.status != 404:
                self.on_error(
                    f"allocatedResourcesStatus of pod {meta['namespace']}/{meta['name']} "
                    f"refused: {exc.status} {exc.body}"
                )

    # --- stopping ------------------------------------------------------------------------

    def _terminate(self, pod: Obj) -> None:
        uid = pod["metadata"]["uid"]
        self._forget(uid)
        try:
            self.core.delete_namespaced_pod(
                pod["metadata"]["name"],
                pod["metadata"]["namespace"],
                body=k8s.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=k8s.V1Preconditions(uid=uid)
                ),
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def _forget(self, uid: str) -> None:
        self._release(uid)
        self.started.pop(uid, None)
        self._not_before.pop(uid, None)
        self._reported.pop(uid, None)

    def _release(self, pod_uid: str) -> None:
        """Unprepares every claim of the pod that no other pod on the node uses."""
        for claim_uid, claim in list(self.claims.items()):
            if pod_uid not in claim.pods:
                continue
            if claim.pods - {pod_uid}:
                claim.pods.discard(pod_uid)
                continue
            for driver in sorted(claim.drivers):
                self._unprepare(driver, claim_uid, claim)
            del self.claims[claim_uid]

    def _unprepare(self, driver: str, claim_uid: str, claim: PreparedClaim) -> None:
        plugin = self.registrar.get(driver)
        if plugin is None:
            message = f"cannot unprepare claim {claim.name}: driver {driver} not registered"
            self.on_error(message)
            return
        pb, stub, channel = plugin.prepare_stub()
        try:
            response = stub.NodeUnprepareResources(
                pb.NodeUnprepareResourcesRequest(
                    claims=[pb.Claim(namespace=claim.namespace, uid=claim_uid, name=claim.name)]
                ),
                timeout=RPC_TIMEOUT_S,
            )
            error = (
                response.claims[claim_uid].error if claim_uid in response.claims else "no result"
            )
        except grpc.RpcError as exc:
            error = f"{exc.code().name}: {exc.details()}"
        finally:
            channel.close()
        if error:
            message = f"NodeUnprepareResources of claim {claim.name} on {driver}: {error}"
            self.on_error(message)

    def _report(self, pod: Obj, reason: str, message: str) -> None:
        """A Warning Event on the pod, once per distinct message (as the kubelet dedupes)."""
        uid = pod["metadata"]["uid"]
        if self._reported.get(uid) == message:
            return
        self._reported[uid] = message
        meta = pod["metadata"]
        event = {
            # Named as the kubelet's event recorder names them: <object>.<unix nanoseconds>.
            "metadata": {
                "name": f"{meta['name']}.{time.time_ns():x}",
                "namespace": meta["namespace"],
            },
            "involvedObject": {
                "kind": "Pod",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": uid,
                "apiVersion": "v1",
            },
            "reason": reason,
            "message": message,
            "type": "Warning",
            "source": {"component": "kubelet", "host": self.node},
            "firstTimestamp": _now(),
            "lastTimestamp": _now(),
            "count": 1,
        }
        try:
            self.core.create_namespaced_event(meta["namespace"], event)  # type: ignore[arg-type]
        except ApiException:
            pass


def _container_status(
    container: Obj, now: str, *, done: bool, resources: list[Obj] | None = None
) -> Obj:
    state: Obj = (
        {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}
        if done
        else {"running": {"startedAt": now}}
    )
    status: Obj = {
        "name": container["name"],
        "image": container.get("image", ""),
        "imageID": "",
        "containerID": f"sandbox://{os.urandom(6).hex()}",
        "ready": not done,
        "started": not done,
        "restartCount": 0,
        "state": state,
    }
    if resources:
        status["allocatedResourcesStatus"] = resources
    return status


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
