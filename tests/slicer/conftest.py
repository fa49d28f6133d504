"""Fixtures for the slicer tests: simulated GPUs as inventory input, schema validation, a
reading of published slices the way the scheduler's counter check sees them, and the empty
cluster and GPUs the agent's tests start from."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, cast

import kubernetes_validate
import pytest
from kubernetes.utils import quantity

from gpu_slicer.core.devices import MigInstance, Mode, SliceSpec
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.slicer.inventory import GpuState
from gpu_slicer.slicer.simulated import SimulatedBackend
from tests.support.agent_fixtures import NODE

parse_quantity = cast(Callable[[str], Decimal], quantity.parse_quantity)


@pytest.fixture
def api() -> InMemoryKubeApi:
    """An empty in-memory cluster (modules that need objects in it override this)."""
    return InMemoryKubeApi()


@pytest.fixture
def backend() -> SimulatedBackend:
    """Two simulated H100s on the agent tests' node."""
    return SimulatedBackend("H100-80GB:2", node_name=NODE)


def states_for(
    spec: str,
    *,
    mode: Mode = "dynamic",
    instances: dict[int, Sequence[tuple[str, int]]] | None = None,
    owned: dict[int, Iterable[tuple[str, int]]] | None = None,
    mig_enabled: bool | None = None,
) -> list[GpuState]:
    """GpuStates of a simulated node; ``instances`` are placements per GPU index (not created on
    a backend: the inventory is pure), ``owned`` the subset the agent made."""
    infos = SimulatedBackend(spec, node_name="node-a").gpus()
    states = []
    for info in infos:
        if mig_enabled is not None:
            info = replace(info, mig_enabled=mig_enabled)
        placed = tuple(
            MigInstance(info.index, p, s, _size(info.model, p), gi, 0, f"MIG-{info.index}-{gi}")
            for gi, (p, s) in enumerate((instances or {}).get(info.index, ()))
        )
        mine = frozenset(SliceSpec(info.index, p, s) for p, s in (owned or {}).get(info.index, ()))
        states.append(GpuState(info, mode=mode, instances=placed, owned=mine))
    return states


def _size(model_key: str, profile: str) -> int:
    from gpu_slicer.core.catalog import get_model

    return get_model(model_key).profile(profile).memory_slices


@pytest.fixture
def make_states() -> Callable[..., list[GpuState]]:
    return states_for


def validate_strict(obj: dict[str, Any], version: str) -> None:
    """Raise kubernetes_validate.ValidationError unless ``obj`` passes the strict schema."""
    kubernetes_validate.validate(obj, version, strict=True)


@pytest.fixture
def validate() -> Callable[[dict[str, Any], str], None]:
    return validate_strict


@dataclass
class PoolView:
    """A pool as the allocator sees it: counter sets and, per device, what it consumes."""

    available: dict[str, dict[str, Decimal]]
    consumes: dict[str, list[tuple[str, dict[str, Decimal]]]]
    devices: dict[str, dict[str, Any]]
    order: list[str]
    """Device names in allocator order: slices by name, devices as listed."""

    def admits(self, names: Iterable[str]) -> bool:
        used: dict[tuple[str, str], Decimal] = {}
        for name in names:
            for counter_set, counters in self.consumes.get(name, []):
                for counter, amount in counters.items():
                    key = (counter_set, counter)
                    used[key] = used.get(key, Decimal(0)) + amount
                    if used[key] > self.available[counter_set].get(counter, Decimal(0)):
                        return False
        return True

    def admitted_sets(self) -> set[frozenset[str]]:
        """Every set of devices the counters admit together: a DFS that adds devices in name
        order and prunes as soon as one does not fit (a subset of an admitted set is admitted)."""
        names = sorted(self.devices)
        needs = {
            n: [((cs, c), int(a)) for cs, counters in self.consumes[n] for c, a in counters.items()]
            for n in names
        }
        limit = {
            (cs, c): int(v) for cs, counters in self.available.items() for c, v in counters.items()
        }
        used: dict[tuple[str, str], int] = dict.fromkeys(limit, 0)
        found: set[frozenset[str]] = {frozenset()}

        def dfs(start: int, chosen: list[str]) -> None:
            for i in range(start, len(names)):
                need = needs[names[i]]
                if all(used.get(k, 0) + a <= limit.get(k, 0) for k, a in need):
                    for k, a in need:
                        used[k] += a
                    chosen.append(names[i])
                    found.add(frozenset(chosen))
                    dfs(i + 1, chosen)
                    chosen.pop()
                    for k, a in need:
                        used[k] -= a

        dfs(0, [])
        return found


def read_pool(slices: Sequence[dict[str, Any]]) -> PoolView:
    available: dict[str, dict[str, Decimal]] = {}
    consumes: dict[str, list[tuple[str, dict[str, Decimal]]]] = {}
    devices: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    for s in sorted(slices, key=lambda s: s["metadata"]["name"]):
        for cs in s["spec"].get("sharedCounters") or []:
            available[cs["name"]] = {
                k: parse_quantity(v["value"]) for k, v in cs["counters"].items()
            }
        for d in s["spec"].get("devices") or []:
            devices[d["name"]] = d
            order.append(d["name"])
            consumes[d["name"]] = [
                (e["counterSet"], {k: parse_quantity(v["value"]) for k, v in e["counters"].items()})
                for e in d.get("consumesCounters") or []
            ]
    return PoolView(available, consumes, devices, order)


@pytest.fixture
def pool_view() -> Callable[[Sequence[dict[str, Any]]], PoolView]:
    return read_pool
