"""The kubelet plugin: registration and DRA services over unix sockets (gRPC).

Sockets, as the kubelet expects them:

* ``<registry dir>/z.gpu-slicer.io-reg.sock`` serves ``pluginregistration.Registration``: the
  kubelet's plugin watcher finds it, calls GetInfo and learns the DRA endpoint and versions.
  ``<registry dir>/gpu-slicer.io-reg.sock`` registers the same endpoint under the driver name of
  releases up to 0.1, so that the kubelet can still prepare and release the claims allocated in
  such a release's pool after an upgrade (:data:`core.identity.LEGACY_DRIVERS`).
* ``<plugins dir>/z.gpu-slicer.io/dra.sock`` serves ``DRAPlugin`` in versions ``v1`` and
  ``v1beta1`` (same messages; v1beta1 lacks ``Device.share_id``) and, when given a
  :class:`~slicer.device_health.HealthFeed`, the resource-health service
  ``v1alpha1.DRAResourceHealth`` (KEP-4680): long-lived ``NodeWatchResources`` streams with
  every device's health, one per driver name the kubelet registered (two: the kubelet watches
  each registration, and reads a stream's updates for the claims allocated under its name).
  A kubelet that does not know the service never calls it. Who else may watch, and who gives
  way when too many do, is :mod:`slicer.health_watchers`.

:class:`DraDriver` holds the version-independent logic; each claim of a batch is handled on its
own (in parallel, so claims on different GPUs do not wait for each other) and a failing claim
only sets its own ``error``. Like dra-example-driver's driver, it only converts requests and
responses and maps errors: :meth:`slicer.state.DeviceState.prepare` answers a claim already
prepared from the checkpoint, without the API or the GPU (it reads the claim only for a claim it
has not prepared), so prepared claims keep working while the apiserver is unreachable.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from gpu_slicer.core.errors import GpuSlicerError
from gpu_slicer.core.identity import DRIVER, DRIVERS
from gpu_slicer.kube import errors as kerrors
from gpu_slicer.kube.atomic_files import ensure_dir
from gpu_slicer.kube.names import DNS_LABEL_MAX, DNS_SUBDOMAIN_MAX, is_dns_label, is_dns_subdomain
from gpu_slicer.slicer.cdi import claim_uid_problem, shown
from gpu_slicer.slicer.checkpoint import PreparedDevice
from gpu_slicer.slicer.claim_cache import AllocatedDevice, ClaimCache, ClaimError, our_results
from gpu_slicer.slicer.device_health import RESEND_S, TIMEOUT_S, DeviceHealth, HealthFeed
from gpu_slicer.slicer.errors import ClaimReferenceError, SlicerError
from gpu_slicer.slicer.health_watchers import MAX_WATCHERS, HealthWatchers
from gpu_slicer.slicer.proto import (
    dra_health_v1alpha1_pb2,
    dra_v1_pb2,
    dra_v1beta1_pb2,
    pluginregistration_pb2,
)
from gpu_slicer.slicer.state import DeviceState, InstanceBusy, PrepareError

log = logging.getLogger(__name__)

DRA_SERVICE_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
"""The kubelet's DRA gRPC service versions this plugin serves, in the order it prefers them."""
DRA_SERVICES: dict[str, ModuleType] = {
    "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin": dra_v1_pb2,
    "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin": dra_v1beta1_pb2,
}
REGISTRATION_SERVICE = "pluginregistration.Registration"
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"
SOCKET_MODE = 0o600
"""Both sockets: only their owner (root on a node, as the kubelet is) may connect."""
SOCKET_DIR_MODE = 0o750
"""The driver's own socket folder, and the registry folder when the agent has to create it."""
_umask_lock = threading.Lock()


def registration_socket(registry_dir: Path | str, driver: str = DRIVER) -> Path:
    return Path(registry_dir) / f"{driver}-reg.sock"


def dra_socket(plugins_dir: Path | str, driver: str = DRIVER) -> Path:
    return Path(plugins_dir) / driver / "dra.sock"


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str


@dataclass(frozen=True)
class PrepareOutcome:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class DraDriver:
    """NodePrepareResources / NodeUnprepareResources, independent of the protocol version."""

    def __init__(
        self,
        state: DeviceState,
        claims: ClaimCache,
        *,
        pool: str,
        names: tuple[str, ...] = DRIVERS,
        max_parallel: int = 8,
    ) -> None:
        self.state = state
        self.claims = claims
        self.pool = pool
        self.names = names
        """The driver names it serves: the first is the one it publishes and listens under."""
        self.driver = names[0]
        self._claim_workers = futures.ThreadPoolExecutor(max_parallel, thread_name_prefix="claim")

    def close(self) -> None:
        self._claim_workers.shutdown(wait=True)

    def prepare(self, refs: list[ClaimRef]) -> dict[str, PrepareOutcome]:
        return self._each(refs, self.prepare_one)

    def unprepare(self, refs: list[ClaimRef]) -> dict[str, str]:
        return self._each(refs, self.unprepare_one)

    def prepare_one(self, ref: ClaimRef) -> PrepareOutcome:
        def allocation() -> list[AllocatedDevice]:
            """Read only for a claim not prepared yet (the state answers prepared ones)."""
            claim = self.claims.get(ref.namespace, ref.name, ref.uid)
            results = our_results(claim, pool=self.pool, drivers=self.names)
            if not results:
                raise ClaimError(
                    f"ResourceClaim {ref.namespace}/{ref.name} has no allocation for driver "
                    f"{' or '.join(self.names)} in pool {self.pool} (not allocated yet, or to "
                    "another node)"
                )
            return results

        try:
            devices = self.state.prepare(ref.uid, ref.namespace, ref.name, allocation)
        except (ClaimError, PrepareError) as exc:
            return PrepareOutcome(error=str(exc))
        except kerrors.KubeError as exc:
            self.state.metrics.api_errors.labels("get-claim").inc()
            return PrepareOutcome(
                error=(
                    f"cannot read ResourceClaim {ref.namespace}/{ref.name} from the apiserver: "
                    f"{exc}; the kubelet will retry"
                )
            )
        return PrepareOutcome(devices=tuple(devices))

    def unprepare_one(self, ref: ClaimRef) -> str:
        try:
            self.state.unprepare(ref.uid)
        except InstanceBusy as exc:
            return str(exc)
        except (OSError, GpuSlicerError) as exc:
            return f"cannot unprepare claim {ref.namespace}/{ref.name}: {exc}; retry resumes it"
        return ""

    def _each(self, refs: list[ClaimRef], fn: Callable[[ClaimRef], Any]) -> dict[str, Any]:
        if len(refs) <= 1:
            return {r.uid: fn(r) for r in refs}
        submitted = {r.uid: self._claim_workers.submit(fn, r) for r in refs}
        return {uid: f.result() for uid, f in submitted.items()}


def claim_refs(request: Any) -> list[ClaimRef]:
    """The request's claims, each checked before its uid can reach a file path (the claim's CDI
    spec) or its namespace and name an apiserver URL; ClaimReferenceError names the first bad
    field. The kubelet sends a claim's ``metadata`` as it is, so only another client fails."""
    refs = []
    for i, claim in enumerate(request.claims):
        ref = ClaimRef(claim.namespace, claim.uid, claim.name)
        where = f"claim {i + 1} of {len(request.claims)}"
        problem = claim_uid_problem(ref.uid)
        if problem is None and not is_dns_label(ref.namespace):
            problem = (
                f"namespace {shown(ref.namespace)} is not a namespace's name: a DNS label "
                f"(lower-case letters, digits and '-', at most {DNS_LABEL_MAX} characters)"
            )
        if problem is None and not is_dns_subdomain(ref.name):
            problem = (
                f"name {shown(ref.name)} is not a ResourceClaim's name: a DNS subdomain "
                f"(lower-case letters, digits, '-' and '.', at most {DNS_SUBDOMAIN_MAX} "
                "characters)"
            )
        if problem is not None:
            raise ClaimReferenceError(f"{where}: {problem}")
        refs.append(ref)
    return refs


def _checked_refs(request: Any, context: grpc.ServicerContext, method: str) -> list[ClaimRef]:
    """:func:`claim_refs`, or the call ends with INVALID_ARGUMENT and the reason (logged once,
    without a traceback: a bad request is the caller's mistake, not the agent's)."""
    try:
        return claim_refs(request)
    except ClaimReferenceError as exc:
        log.warning("refused a request", extra={"method": method, "error": str(exc)})
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{method}: {exc}")
        raise  # abort raises; this keeps the type checker informed


def _unary(
    method: Callable[[Any, grpc.ServicerContext], Any], request_type: Any, response_type: Any
) -> grpc.RpcMethodHandler:
    """A unary-unary method that reads ``request_type`` and writes ``response_type`` messages."""
    return grpc.unary_unary_rpc_method_handler(
        method,
        request_deserializer=request_type.FromString,
        response_serializer=response_type.SerializeToString,
    )


def dra_handler(service: str, pb: ModuleType, driver: DraDriver) -> grpc.GenericRpcHandler:
    """The DRAPlugin service of one protocol version, backed by ``driver``."""

    def prepare(request: Any, context: grpc.ServicerContext) -> Any:
        outcomes = driver.prepare(_checked_refs(request, context, "NodePrepareResources"))
        response = pb.NodePrepareResourcesResponse()
        for uid, outcome in outcomes.items():
            entry = response.claims[uid]
            if outcome.error:
                entry.error = outcome.error
                continue
            for device in outcome.devices:
                entry.devices.add(
                    request_names=list(device.request_names),
                    pool_name=driver.pool,
                    device_name=device.device_name,
                    cdi_device_ids=[device.cdi_device_id],
                )
        return response

    def unprepare(request: Any, context: grpc.ServicerContext) -> Any:
        errors = driver.unprepare(_checked_refs(request, context, "NodeUnprepareResources"))
        response = pb.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
        return response

    return grpc.method_handlers_generic_handler(
        service,
        {
            "NodePrepareResources": _unary(
                prepare, pb.NodePrepareResourcesRequest, pb.NodePrepareResourcesResponse
            ),
            "NodeUnprepareResources": _unary(
                unprepare, pb.NodeUnprepareResourcesRequest, pb.NodeUnprepareResourcesResponse
            ),
        },
    )


def health_response(
    pool: str, devices: Sequence[DeviceHealth], *, now: int, timeout_s: int = TIMEOUT_S
) -> Any:
    """One ``NodeWatchResourcesResponse``: every device of the pool, stamped ``now``."""
    pb = dra_health_v1alpha1_pb2
    response = pb.NodeWatchResourcesResponse()
    for device in devices:
        response.devices.add(
            device=pb.DeviceIdentifier(pool_name=pool, device_name=device.device),
            health=pb.HEALTHY if device.healthy else pb.UNHEALTHY,
            last_updated_time=now,
            health_check_timeout_seconds=timeout_s,
            message=device.message,
        )
    return response


def health_handler(
    feed: HealthFeed,
    pool: str,
    closing: threading.Event,
    *,
    watchers: HealthWatchers | None = None,
    resend_s: float = RESEND_S,
    clock: Callable[[], float] = time.time,
) -> grpc.GenericRpcHandler:
    """The resource-health service: a stream that ends when the kubelet cancels it, the server
    stops (``closing``) or ``watchers`` closes it (:mod:`slicer.health_watchers`: a newer
    watcher needed its place, or it stopped reading)."""
    pb = dra_health_v1alpha1_pb2
    registry = watchers if watchers is not None else HealthWatchers()

    def watch(request: Any, context: grpc.ServicerContext) -> Any:
        watcher = registry.admit(context.cancel)
        context.add_callback(watcher.wake.set)  # the client went away: stop waiting at once
        context.add_callback(lambda: registry.leave(watcher))  # its place, whatever the thread does

        def alive() -> bool:
            return context.is_active() and not closing.is_set() and not watcher.closed

        log.debug("a client watches device health", extra={"watcher": watcher.number})
        try:
            for devices in feed.stream(watcher.wake, alive, resend_s=resend_s):
                if not registry.sending(watcher):
                    break
                yield health_response(pool, devices, now=int(clock()))
                registry.sent(watcher)
        finally:
            registry.leave(watcher)
        if watcher.closed:
            context.set_code(grpc.StatusCode.RESOURCE_EXHAUSTED)
            context.set_details(watcher.closed)
        log.debug("device health stream ended", extra={"watcher": watcher.number})

    return grpc.method_handlers_generic_handler(
        HEALTH_SERVICE,
        {
            "NodeWatchResources": grpc.unary_stream_rpc_method_handler(
                watch,
                request_deserializer=pb.NodeWatchResourcesRequest.FromString,
                response_serializer=pb.NodeWatchResourcesResponse.SerializeToString,
            )
        },
    )


class RegistrationState:
    """What the kubelet told us in NotifyRegistrationStatus."""

    def __init__(self) -> None:
        self.registered = threading.Event()
        self.error: str | None = None


def registration_handler(
    endpoint: str, status: RegistrationState, driver: str = DRIVER
) -> grpc.GenericRpcHandler:
    pb = pluginregistration_pb2

    def get_info(request: Any, context: grpc.ServicerContext) -> Any:
        return pb.PluginInfo(
            type="DRAPlugin",
            name=driver,
            endpoint=endpoint,
            supported_versions=list(DRA_SERVICE_VERSIONS),
        )

    def notify(request: Any, context: grpc.ServicerContext) -> Any:
        if request.plugin_registered:
            status.error = None
            status.registered.set()
            log.info("registered with the kubelet", extra={"driver": driver})
        else:
            status.error = request.error
            status.registered.clear()
            log.error(
                "kubelet refused the plugin registration",
                extra={"driver": driver, "error": request.error},
            )
        return pb.RegistrationStatusResponse()

    return grpc.method_handlers_generic_handler(
        REGISTRATION_SERVICE,
        {
            "GetInfo": _unary(get_info, pb.InfoRequest, pb.PluginInfo),
            "NotifyRegistrationStatus": _unary(
                notify, pb.RegistrationStatus, pb.RegistrationStatusResponse
            ),
        },
    )


class PluginServer:
    """Both gRPC servers; :meth:`start` binds the sockets, :meth:`stop` removes them."""

    def __init__(
        self,
        driver: DraDriver,
        *,
        plugins_dir: Path | str,
        registry_dir: Path | str,
        workers: int = 8,
        health: HealthFeed | None = None,
    ) -> None:
        self.driver = driver
        self.health = health
        self._closing = threading.Event()
        self.dra_path = dra_socket(plugins_dir, driver.driver)
        self.registration_path = registration_socket(registry_dir, driver.driver)
        self.legacy_registration_paths = [
            registration_socket(registry_dir, name) for name in driver.names[1:]
        ]
        """One per earlier driver name, all naming :attr:`dra_path` as their endpoint."""
        for path in (self.dra_path, self.registration_path, *self.legacy_registration_paths):
            if len(str(path)) >= 108:
                raise SlicerError(
                    f"unix socket path {path} is {len(str(path))} bytes; the limit is 107. "
                    "Use a shorter --plugins-dir/--registry-dir"
                )
        self.registration = RegistrationState()
        self.legacy_registrations = {name: RegistrationState() for name in driver.names[1:]}
        self.health_watchers = HealthWatchers(limit=MAX_WATCHERS)
        self._workers = workers
        self._servers: list[grpc.Server] = []

    def start(self) -> None:
        handlers = [dra_handler(name, pb, self.driver) for name, pb in DRA_SERVICES.items()]
        workers = self._workers
        if self.health is not None:
            self._closing.clear()
            handlers.append(
                health_handler(
                    self.health, self.driver.pool, self._closing, watchers=self.health_watchers
                )
            )
            # Open streams must not starve prepare calls; a closed watcher's thread ends at once.
            workers += self.health_watchers.limit
        dra = grpc.server(futures.ThreadPoolExecutor(workers, thread_name_prefix="dra"))
        dra.add_generic_rpc_handlers(handlers)
        _bind(dra, self.dra_path, own_dir=True)
        registrations = [
            (self.registration_path, self.driver.driver, self.registration),
            *(
                (path, name, self.legacy_registrations[name])
                for path, name in zip(
                    self.legacy_registration_paths, self.driver.names[1:], strict=True
                )
            ),
        ]
        # The DRA socket must answer before the kubelet can find a registration socket.
        dra.start()
        self._servers.append(dra)
        for path, name, status in registrations:
            reg = grpc.server(futures.ThreadPoolExecutor(2, thread_name_prefix="registration"))
            reg.add_generic_rpc_handlers([registration_handler(str(self.dra_path), status, name)])
            _bind(reg, path, own_dir=False)
            reg.start()
            self._servers.append(reg)
        log.info(
            "kubelet plugin serving",
            extra={
                "dra_socket": str(self.dra_path),
                "registration_sockets": [str(path) for path, _, _ in registrations],
            },
        )

    def stop(self, grace_s: float = 5.0) -> None:
        # Registration first, so the kubelet stops sending work before the service goes; health
        # streams end cleanly (the kubelet reads the end and dials again, the next agent).
        self._closing.set()
        if self.health is not None:
            self.health.changed()
        for server in reversed(self._servers):
            server.stop(grace_s).wait()
        self._servers.clear()
        for path in (*self.legacy_registration_paths, self.registration_path, self.dra_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _bind(server: grpc.Server, path: Path, *, own_dir: bool) -> None:
    """Listen on ``path`` with mode :data:`SOCKET_MODE` from the first instant, whatever the
    umask: the socket is made under a umask that leaves it no more than that (a socket's mode
    comes from the umask alone), then set explicitly. The umask is the process's, so it is
    narrowed only around the bind; anything another thread creates meanwhile can only come out
    stricter, and every file and folder the agent makes sets its mode explicitly anyway."""
    ensure_dir(path.parent, SOCKET_DIR_MODE, own=own_dir)
    try:
        os.unlink(path)  # a stale socket from a previous run refuses the bind
    except FileNotFoundError:
        pass
    with _umask_lock:
        previous = os.umask(0o777 & ~SOCKET_MODE)
        try:
            port = server.add_insecure_port(f"unix://{path}")
        finally:
            os.umask(previous)
    if port == 0:
        raise SlicerError(f"cannot listen on unix socket {path}")
    os.chmod(path, SOCKET_MODE)
