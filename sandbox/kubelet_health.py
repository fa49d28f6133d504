"""The kubelet stand-in's side of DRA resource health (KEP-4680), as the kubelet 1.36 does it.

What the real kubelet does (pkg/kubelet/cm/dra: the plugin manager, ``healthinfo.go`` and
``Manager.UpdateAllocatedResourcesStatus``), and so what this module does:

* For each registered DRA plugin it calls ``v1alpha1.DRAResourceHealth/NodeWatchResources`` on
  the plugin's endpoint and reads the stream. When the call fails (a driver without the service
  answers Unimplemented) or the stream ends, it forgets that driver's health and calls again
  5 seconds later, for as long as the plugin stays registered.
* Each message replaces the driver's report: every device listed is stamped with the time it
  was *received* (the driver's own timestamp is ignored) and its ``health_check_timeout_seconds``
  (default 30). A device not heard of for longer than its timeout reads Unknown.
* Devices whose health or message changed name the pods to update: those whose prepared claims
  hold the device. Their status is synced.
* A pod's status gets, per regular container that references claims
  (``resources.claims``), one ``allocatedResourcesStatus`` entry per reference, named
  ``claim:<pod claim name>`` or ``claim:<pod claim name>/<request>``, with one resource per
  prepared device of that claim (of that request, when named): ``resourceID`` is the device's
  first CDI device id (else ``<driver>/<pool>/<device>``), ``health`` is Healthy, Unhealthy or
  Unknown, ``message`` the driver's message when there is one. Entries without resources are
  left out.

Only kubelets of 1.36 and newer do this (feature ``ResourceHealthStatus``, beta and on by
default from 1.36); the sandbox turns it off for older releases.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from gpu_slicer.slicer.proto import dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc

log = logging.getLogger(__name__)

RETRY_S = 5.0
"""The kubelet calls NodeWatchResources again this long after a call fails or a stream ends."""
DEFAULT_TIMEOUT_S = 30.0
"""The kubelet's health timeout for a device whose report names none."""
MESSAGE_LIMIT = 1024
"""The API's limit on a health message; longer ones are cut to 1021 characters and '...'."""
HEALTH_NAMES = {
    dra_health_v1alpha1_pb2.HEALTHY: "Healthy",
    dra_health_v1alpha1_pb2.UNHEALTHY: "Unhealthy",
}
UNKNOWN = "Unknown"

Obj = dict[str, Any]
DeviceKey = tuple[str, str]
"""(pool, device)."""
Lookup = Callable[[str, str, str], tuple[str, str]]
"""(driver, pool, device) -> (health, message)."""


@dataclass(frozen=True)
class Reported:
    """One device's health as last received."""

    health: str
    message: str
    received: float
    timeout_s: float


@dataclass(frozen=True)
class AllocatedDevice:
    """A device a prepared claim holds, as NodePrepareResources answered it."""

    driver: str
    pool: str
    device: str
    request_names: tuple[str, ...]
    """Base request names (a subrequest's ``/<name>`` stripped)."""
    cdi_ids: tuple[str, ...]


def _message(text: str) -> str:
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."


class HealthCache:
    """Per driver, what its stream last said of each (pool, device); ``healthinfo.go``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._drivers: dict[str, dict[DeviceKey, Reported]] = {}

    def update(self, driver: str, response: Any) -> list[DeviceKey]:
        """Take a ``NodeWatchResourcesResponse``; the devices whose health or message changed,
        and those that timed out to Unknown because the report left them out."""
        now = self._clock()
        changed: list[DeviceKey] = []
        with self._lock:
            known = self._drivers.setdefault(driver, {})
            listed: set[DeviceKey] = set()
            for device in response.devices:
                key = (device.device.pool_name, device.device.device_name)
                listed.add(key)
                timeout = device.health_check_timeout_seconds
                report = Reported(
                    HEALTH_NAMES.get(device.health, UNKNOWN),
                    _message(device.message),
                    now,
                    float(timeout) if timeout > 0 else DEFAULT_TIMEOUT_S,
                )
                old = known.get(key)
                if old is None or (old.health, old.message, old.timeout_s) != (
                    report.health,
                    report.message,
                    report.timeout_s,
                ):
                    changed.append(key)
                known[key] = report
            for key, old in list(known.items()):
                if key in listed or old.health == UNKNOWN:
                    continue
                if now - old.received > old.timeout_s:
                    known[key] = Reported(UNKNOWN, "", now, old.timeout_s)
                    changed.append(key)
        return changed

    def get(self, driver: str, pool: str, device: str) -> tuple[str, str]:
        """(health, message); Unknown when never heard of or heard of too long ago."""
        with self._lock:
            report = self._drivers.get(driver, {}).get((pool, device))
        if report is None or self._clock() - report.received > report.timeout_s:
            return UNKNOWN, ""
        return report.health, report.message

    def clear_driver(self, driver: str) -> None:
        with self._lock:
            self._drivers.pop(driver, None)


def _claim_name(pod: Obj, pod_claim: str) -> str | None:
    """The ResourceClaim behind a pod claim: from ``resourceClaimStatuses``, else the spec's
    ``resourceClaimName``."""
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if status.get("name") == pod_claim and status.get("resourceClaimName"):
            return str(status["resourceClaimName"])
    for claim in pod["spec"].get("resourceClaims") or []:
        if claim.get("name") == pod_claim and claim.get("resourceClaimName"):
            return str(claim["resourceClaimName"])
    return None


def container_resource_status(
    pod: Obj,
    container: Obj,
    claims: Mapping[str, Sequence[AllocatedDevice]],
    health: Lookup,
) -> list[Obj]:
    """The ``allocatedResourcesStatus`` of one regular container. ``claims`` is ResourceClaim
    name -> the devices the kubelet prepared for it (claims it did not prepare are skipped)."""
    statuses: list[Obj] = []
    for ref in (container.get("resources") or {}).get("claims") or []:
        claim_name = _claim_name(pod, ref["name"])
        devices = claims.get(claim_name or "")
        if devices is None:
            continue
        request = ref.get("request") or ""
        name = f"claim:{ref['name']}" + (f"/{request}" if request else "")
        resources: list[Obj] = []
        seen: set[str] = set()
        for device in devices:
            base = request.split("/", 1)[0]
            if request and device.request_names and base not in device.request_names:
                continue
            resource_id = (
                device.cdi_ids[0]
                if device.cdi_ids
                else f"{device.driver}/{device.pool}/{device.device}"
            )
            if resource_id in seen:
                continue
            seen.add(resource_id)
            state, message = health(device.driver, device.pool, device.device)
            entry: Obj = {"resourceID": resource_id, "health": state}
            if message:
                entry["message"] = message
            resources.append(entry)
        if resources:
            statuses.append({"name": name, "resources": resources})
    return statuses


def pod_resource_status(
    pod: Obj, claims: Mapping[str, Sequence[AllocatedDevice]], health: Lookup
) -> dict[str, list[Obj]]:
    """Container name -> its ``allocatedResourcesStatus``, for the regular containers that
    reference claims (init containers get none, as from the kubelet)."""
    return {
        c["name"]: container_resource_status(pod, c, claims, health)
        for c in pod["spec"]["containers"]
        if (c.get("resources") or {}).get("claims")
    }


class HealthWatch:
    """One registered plugin's health stream, called again and again until :meth:`stop`."""

    def __init__(
        self,
        driver: str,
        endpoint: str,
        cache: HealthCache,
        on_change: Callable[[str, list[DeviceKey]], None],
        *,
        retry_s: float = RETRY_S,
    ) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.cache = cache
        self.on_change = on_change
        self.retry_s = retry_s
        self.streams = 0
        """Streams opened so far (one per successful call)."""
        self.last_error = ""
        self._stop = threading.Event()
        self._call: Any = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"health-{driver}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            channel = grpc.insecure_channel(f"unix://{self.endpoint}")
            try:
                self._watch(channel)
            except grpc.RpcError as exc:
                if not self._stop.is_set():
                    self.last_error = f"{exc.code().name}: {exc.details()}"
                    log.debug(
                        "resource-health stream failed; retrying",
                        extra={"driver": self.driver, "error": self.last_error},
                    )
            finally:
                self.cache.clear_driver(self.driver)
                channel.close()
            self._stop.wait(self.retry_s)

    def _watch(self, channel: grpc.Channel) -> None:
        stub = dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(channel)  # type: ignore[no-untyped-call]
        call = stub.NodeWatchResources(dra_health_v1alpha1_pb2.NodeWatchResourcesRequest())
        with self._lock:
            self._call = call
        if self._stop.is_set():
            call.cancel()
        first = True
        for response in call:
            if first:
                self.streams += 1
                first = False
            changed = self.cache.update(self.driver, response)
            if changed:
                self.on_change(self.driver, changed)


def pods_holding(
    claims: Iterable[tuple[set[str], Sequence[AllocatedDevice]]],
    driver: str,
    changed: Iterable[DeviceKey],
) -> set[str]:
    """The pods (uids) whose prepared claims hold one of the ``changed`` devices of ``driver``;
    ``claims`` gives each prepared claim's pods and devices."""
    keys = set(changed)
    return {
        uid
        for pods, devices in claims
        if any(d.driver == driver and (d.pool, d.device) in keys for d in devices)
        for uid in pods
    }
