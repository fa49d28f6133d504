"""Building blocks for the node agent's tests: claims in an in-memory cluster, an agent's parts
on a simulated backend, and a backend proxy that "crashes" the agent at a chosen call.

A crash is modelled by :class:`AgentCrash`, a BaseException: the agent's code catches Exception
subclasses only, so nothing of the dying agent runs after it (no rollback), exactly as when the
process is killed. The test then builds a fresh agent on the same checkpoint directory, CDI
directory and backend, as a restarted pod would.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_slicer.core.identity import DOMAIN, DRIVER
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.slicer.agent import AgentConfig, assemble
from gpu_slicer.slicer.agent_metrics import AgentMetrics
from gpu_slicer.slicer.backend import model_of
from gpu_slicer.slicer.claim_cache import ClaimCache
from gpu_slicer.slicer.clock import SYSTEM_CLOCK, Clock
from gpu_slicer.slicer.health import HealthTracker
from gpu_slicer.slicer.inventory import default_mode
from gpu_slicer.slicer.reconciler import NodeView, Reconciler
from gpu_slicer.slicer.simulated import SimulatedBackend
from gpu_slicer.slicer.state import DeviceState

NODE = "node-a"

_uids = itertools.count(1)


class AgentCrash(BaseException):
    """The agent process dies here (not an Exception: nothing catches it)."""


def allocate_claim(
    api: InMemoryKubeApi,
    devices: list[str],
    *,
    name: str | None = None,
    namespace: str = "ml",
    pool: str = NODE,
    request: str = "gpu",
    spec: dict[str, Any] | None = None,
    driver: str = DRIVER,
) -> dict[str, Any]:
    """Create a ResourceClaim allocated to ``devices`` in ``pool`` (under ``driver``: 0.1's
    name for a claim allocated before an upgrade); returns the stored claim. Its spec asks for
    any MIG slice unless ``spec`` says otherwise."""
    name = name or f"claim-{next(_uids)}"
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec
        or {
            "devices": {
                "requests": [
                    {
                        "name": request,
                        "exactly": {"deviceClassName": "mig.gpu-slicer.io", "count": 1},
                    }
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": request, "driver": driver, "pool": pool, "device": d}
                        for d in devices
                    ]
                }
            }
        },
    }
    return api.create(claim)


def deallocate(api: InMemoryKubeApi, claim: dict[str, Any]) -> None:
    stored = api.get(
        "resource.k8s.io/v1",
        "ResourceClaim",
        claim["metadata"]["name"],
        claim["metadata"]["namespace"],
    )
    stored["status"] = {}
    api.update(stored)


def delete_claim(api: InMemoryKubeApi, claim: dict[str, Any]) -> None:
    api.delete(
        "resource.k8s.io/v1",
        "ResourceClaim",
        claim["metadata"]["name"],
        claim["metadata"]["namespace"],
    )


def ref(claim: dict[str, Any]) -> tuple[str, str, str]:
    meta = claim["metadata"]
    return meta["uid"], meta["namespace"], meta["name"]


@dataclass
class Agent:
    """An agent's parts from slicer.agent, as the agent wires them (no threads, no sockets)."""

    backend: Any
    api: InMemoryKubeApi
    state: DeviceState
    claims: ClaimCache
    reconciler: Reconciler
    health: HealthTracker
    metrics: AgentMetrics
    published: list[NodeView] = field(default_factory=list)

    def prepare(self, claim: dict[str, Any]) -> Any:
        from gpu_slicer.slicer.claim_cache import our_results

        uid, ns, name = ref(claim)
        stored = self.claims.get(ns, name, uid)
        return self.state.prepare(uid, ns, name, our_results(stored, pool=NODE))

    def unprepare(self, claim: dict[str, Any]) -> bool:
        return self.state.unprepare(claim["metadata"]["uid"])

    def reconcile(self) -> Any:
        self.claims.sync_once()
        return self.reconciler.reconcile_once()


def build_agent(
    backend: Any,
    api: InMemoryKubeApi,
    root: Path,
    *,
    clock: Callable[[], float] | None = None,
    stale_after_s: float = 120.0,
    static_layout: Any = None,
) -> Agent:
    """A fresh agent on ``root/checkpoint`` and ``root/cdi`` (new state objects every call);
    ``clock`` stamps checkpoint entries."""
    config = AgentConfig(
        node=NODE,
        checkpoint_dir=root / "checkpoint",
        cdi_dir=root / "cdi",
        stale_prepare_s=stale_after_s,
        static_layout=static_layout,
    )
    published: list[NodeView] = []
    parts = assemble(
        config,
        backend=backend,
        api=api,
        modes={g.index: default_mode(model_of(g)) for g in backend.gpus()},
        republish=published.append,
        clock=Clock(time=clock) if clock else SYSTEM_CLOCK,
    )
    parts.claims.sync_once()
    return Agent(
        backend,
        api,
        parts.state,
        parts.claims,
        parts.reconciler,
        parts.health,
        parts.metrics,
        published,
    )


class CrashingBackend:
    """A SimulatedBackend proxy that raises AgentCrash at the n-th call of one method.

    ``after=True`` crashes *after* the call took effect (the agent never learns the result: the
    most damaging moment), ``after=False`` before it reached the GPU.
    """

    def __init__(self, inner: SimulatedBackend) -> None:
        self.inner = inner
        self._armed: tuple[str, int, bool] | None = None

    def crash_at(self, method: str, *, nth: int = 1, after: bool = False) -> None:
        self._armed = (method, nth, after)

    def disarm(self) -> None:
        self._armed = None

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if not callable(target) or self._armed is None or self._armed[0] != name:
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            armed = self._armed
            if armed is None or armed[0] != name:
                return target(*args, **kwargs)
            method, nth, after = armed
            if nth > 1:
                self._armed = (method, nth - 1, after)
                return target(*args, **kwargs)
            self._armed = None
            if not after:
                raise AgentCrash(f"crash before {name}")
            target(*args, **kwargs)
            raise AgentCrash(f"crash after {name}")

        return call


def live_instances(backend: Any) -> list[Any]:
    found = []
    for info in backend.gpus():
        if info.mig_enabled:
            found.extend(backend.instances(info.index))
    return found


def node_slices(backend: Any, node: str = NODE) -> list[dict[str, Any]]:
    """The ResourceSlices the agent publishes for ``backend``'s GPUs in their default modes."""
    from gpu_slicer.slicer.inventory import GpuState, build_slices

    states = [
        GpuState(
            info=g, mode=default_mode(model_of(g)), instances=tuple(backend.instances(g.index))
        )
        for g in backend.gpus()
    ]
    return build_slices(node, states)


def bare_names(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``devices`` as 0.1 published them (and as NVIDIA's driver names its own): attributes and
    capacities of gpu-slicer's domain spelled bare, other domains' names kept qualified."""

    def bare(names: dict[str, Any]) -> dict[str, Any]:
        return {k.removeprefix(f"{DOMAIN}/"): v for k, v in names.items()}

    return [
        {**d, "attributes": bare(d["attributes"]), "capacity": bare(d["capacity"])} for d in devices
    ]


def devices_by_name(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def assert_mixed_node(
    devices: dict[str, dict[str, Any]], *, whole_only: int, mig: tuple[int, ...]
) -> None:
    """GPU ``whole_only`` (no MIG) is one whole device without counters or NVLink; the GPUs in
    ``mig`` are offered whole and as MIG slices."""
    own = [n for n in devices if n == f"gpu-{whole_only}" or n.startswith(f"gpu-{whole_only}-")]
    assert own == [f"gpu-{whole_only}"], own
    whole = devices[f"gpu-{whole_only}"]
    assert whole["attributes"]["gpu-slicer.io/type"] == {"string": "gpu"}
    assert "consumesCounters" not in whole and "nvlinkDomain" not in whole["attributes"]
    for index in mig:
        assert f"gpu-{index}" in devices
        assert any(n.startswith(f"gpu-{index}-mig-") for n in devices), index


def simulated_agent_args(folder: Path, *, node: str = "n1", gpus: str = "H100-80GB:1") -> list[str]:
    """``agent run`` on simulated GPUs and an in-memory API, its folders under ``folder``
    (``ckpt``, ``cdi``, ``plugins``, ``reg``); add ``--metrics-bind`` and the rest."""
    return [
        "agent",
        "run",
        "--node",
        node,
        "--backend",
        "simulated",
        "--simulate-gpus",
        gpus,
        "--kube",
        "memory",
        "--checkpoint-dir",
        str(folder / "ckpt"),
        "--cdi-dir",
        str(folder / "cdi"),
        "--plugins-dir",
        str(folder / "plugins"),
        "--registry-dir",
        str(folder / "reg"),
    ]


def agent_config(root: Path, node: str = NODE, **settings: Any) -> AgentConfig:
    """An agent's folders under ``root`` (short: socket paths), no metrics server, quick passes;
    ``settings`` override the rest."""
    return AgentConfig(
        **{
            "node": node,
            "checkpoint_dir": root / "ckpt",
            "cdi_dir": root / "cdi",
            "plugins_dir": root / "plugins",
            "registry_dir": root / "reg",
            "metrics_bind": "",
            "reconcile_interval_s": 0.2,
            **settings,
        }
    )
