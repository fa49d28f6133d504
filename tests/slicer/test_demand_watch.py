"""The agent advertises what the cluster's templates and claims ask for (slicer.demand_watch),
on the in-memory apiserver: a new shape appears at the next pass, a shape nobody asks for any
more goes after the delay, and a device a claim holds never goes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_slicer.core.devices import SliceSpec, parse_device_name
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.sim.agreement import claim_spec_for
from gpu_slicer.slicer.agent import AgentConfig, AgentParts, assemble
from gpu_slicer.slicer.clock import Clock
from gpu_slicer.slicer.inventory import ADVERTISED_ANNOTATION
from gpu_slicer.slicer.profile_filter import ProfileFilter
from gpu_slicer.slicer.simulated import SimulatedBackend
from tests.support.agent_fixtures import NODE, allocate_claim

SLICES = ("resource.k8s.io/v1", "ResourceSlice")
WITHDRAW_AFTER = 600.0


class Now:
    def __init__(self) -> None:
        self.value = 1000.0

    def __call__(self) -> float:
        return self.value


@pytest.fixture
def now() -> Now:
    return Now()


def agent(api: InMemoryKubeApi, tmp_path: Path, now: Now, **config: Any) -> AgentParts:
    parts = assemble(
        AgentConfig(
            node=NODE,
            checkpoint_dir=tmp_path / "c",
            cdi_dir=tmp_path / "d",
            withdraw_after_s=WITHDRAW_AFTER,
            **config,
        ),
        backend=SimulatedBackend("A100-80GB:1,H100-80GB:1", node_name=NODE),
        api=api,
        clock=Clock(monotonic=now),
    )
    return parts


def reconcile(parts: AgentParts) -> None:
    parts.claims.sync_once()
    assert parts.demand is not None
    parts.demand.sync_once()
    parts.reconciler.reconcile_once()


def published(api: InMemoryKubeApi) -> set[str]:
    return {d["name"] for s in api.objects(*SLICES) for d in s["spec"].get("devices") or ()}


def profiles(api: InMemoryKubeApi) -> set[str]:
    specs = [parse_device_name(name) for name in published(api)]
    return {spec.profile for spec in specs if isinstance(spec, SliceSpec)}


def template(api: InMemoryKubeApi, name: str, resources: dict[str, int]) -> None:
    api.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"spec": claim_spec_for([resources])},
        }
    )


def test_a_node_nobody_asks_anything_of_advertises_whole_gpus_only(
    api: InMemoryKubeApi, tmp_path: Path, now: Now
) -> None:
    reconcile(agent(api, tmp_path, now))
    assert published(api) == {"gpu-1"}  # the H100 (dynamic) whole; the A100 runs MIG slices


def test_a_template_brings_its_profile_and_the_delay_takes_it_away(
    api: InMemoryKubeApi, tmp_path: Path, now: Now
) -> None:
    parts = agent(api, tmp_path, now)
    reconcile(parts)
    template(api, "small", {"nvidia.com/mig-1g.10gb": 1})
    reconcile(parts)
    assert profiles(api) == {"1g.10gb"}
    assert "gpu-0-mig-1g10gb-6" in published(api) and "gpu-1-mig-1g10gb-6" in published(api)
    annotations = {
        s["metadata"].get("annotations", {}).get(ADVERTISED_ANNOTATION)
        for s in api.objects(*SLICES)
    }
    assert annotations == {"1g.10gb=asked"}

    api.delete("resource.k8s.io/v1", "ResourceClaimTemplate", "small", "ml")
    now.value += WITHDRAW_AFTER - 1
    reconcile(parts)
    assert profiles(api) == {"1g.10gb"}
    report = parts.reconciler.last_report
    assert report is not None and report.recall_in == pytest.approx(1.0, abs=0.5)
    now.value += 1
    reconcile(parts)
    assert profiles(api) == set()


def test_a_device_a_claim_holds_is_never_withdrawn(
    api: InMemoryKubeApi, tmp_path: Path, now: Now
) -> None:
    parts = agent(api, tmp_path, now)
    template(api, "small", {"nvidia.com/mig-1g.10gb": 1})
    reconcile(parts)
    # A claim that asks for 3g.40gb holds a 1g.10gb slice (allocated while 1g.10gb was asked).
    allocate_claim(
        api, ["gpu-0-mig-1g10gb-6"], spec=claim_spec_for([{"nvidia.com/mig-3g.40gb": 1}])
    )
    api.delete("resource.k8s.io/v1", "ResourceClaimTemplate", "small", "ml")
    now.value += 10 * WITHDRAW_AFTER
    reconcile(parts)
    ones = {n for n in published(api) if "-mig-1g10gb-" in n}
    assert ones == {"gpu-0-mig-1g10gb-6"}
    assert profiles(api) == {"1g.10gb", "3g.40gb"}


def test_a_restart_keeps_a_recent_profile_whose_devices_busy_gpus_leave_out(
    api: InMemoryKubeApi, tmp_path: Path, now: Now
) -> None:
    parts = agent(api, tmp_path, now)
    template(api, "big", {"nvidia.com/mig-7g.80gb": 1})
    reconcile(parts)
    assert "7g.80gb" in profiles(api)
    small = claim_spec_for([{"nvidia.com/mig-1g.10gb": 1}])
    claims = [allocate_claim(api, [f"gpu-{i}-mig-1g10gb-6"], spec=small) for i in (0, 1)]
    now.value += 30  # past the limiter: the busy GPUs' pool is written
    reconcile(parts)
    assert "7g.80gb" not in profiles(api)  # each GPU's slice leaves no room for it
    api.delete("resource.k8s.io/v1", "ResourceClaimTemplate", "big", "ml")

    restarted = agent(api, tmp_path, now)  # the annotation still says it was chosen
    now.value += 1
    reconcile(restarted)
    for claim in claims:
        api.delete("resource.k8s.io/v1", "ResourceClaim", claim["metadata"]["name"], "ml")
    reconcile(restarted)
    assert "7g.80gb" in profiles(api)  # still within --withdraw-after
    now.value += WITHDRAW_AFTER
    reconcile(restarted)
    assert "7g.80gb" not in profiles(api)


def test_the_floor_and_the_limit_reach_the_pool(
    api: InMemoryKubeApi, tmp_path: Path, now: Now
) -> None:
    parts = agent(
        api,
        tmp_path,
        now,
        always_advertise=ProfileFilter.parse("2g.20gb"),
        profiles=ProfileFilter.parse("-1g.10gb"),
    )
    template(api, "small", {"nvidia.com/mig-1g.10gb": 1})
    reconcile(parts)
    assert profiles(api) == {"2g.20gb"}


def test_every_profile_when_asked_to(api: InMemoryKubeApi, tmp_path: Path, now: Now) -> None:
    parts = agent(api, tmp_path, now, advertised_profiles="all")
    assert parts.demand is None
    parts.claims.sync_once()
    parts.reconciler.reconcile_once()
    assert {"1g.10gb", "1g.10gb+me", "3g.40gb", "7g.80gb"} <= profiles(api)
