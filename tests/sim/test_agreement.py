"""The pure half of the scheduler-agreement measurement (sim.agreement)."""

from __future__ import annotations

from typing import Any

from gpu_slicer.sim.agreement import (
    ALLOCATED,
    ERROR,
    UNSCHEDULABLE,
    Outcome,
    ReplayOrder,
    ReplayPod,
    Step,
    agreement,
    claim_spec_for,
    mixed_pods,
    model_outcome,
    noon_burst_pods,
    outcome_of_allocation,
)
from tests.sim.test_allocator import CLASSES, DRIVER, mig, slice_obj

Obj = dict[str, Any]


def result(request: str, device: str, pool: str = "n1") -> Obj:
    return {"request": request, "driver": DRIVER, "pool": pool, "device": device}


def allocated(*results: Obj) -> Outcome:
    return outcome_of_allocation({"devices": {"results": list(results)}})


def test_outcome_of_allocation_reads_results_and_absence() -> None:
    outcome = allocated(result("main/small", "gpu-0-mig-1g-6"), result("main/small", "a"))
    assert outcome.status == ALLOCATED
    assert outcome.subrequests == ("main/small",)
    assert [d[3] for d in outcome.devices] == ["a", "gpu-0-mig-1g-6"]
    assert outcome.describe() == "main/small: gpu-0-mig-1g-6, a"
    assert outcome_of_allocation(None).status == UNSCHEDULABLE


def test_steps_agree_only_on_same_subrequest_and_devices() -> None:
    same = Step("w", "c", "n1", allocated(result("r/a", "d1")), allocated(result("r/a", "d1")))
    assert same.agrees and same.difference() == ""
    order = Step(
        "w",
        "c",
        "n1",
        allocated(result("r", "d1"), result("r", "d2")),
        allocated(result("r", "d2"), result("r", "d1")),
    )
    assert order.agrees  # result order is not a decision
    devices = Step("w", "c", "n1", allocated(result("r/a", "d1")), allocated(result("r/a", "d2")))
    assert devices.subrequests_agree and not devices.agrees
    assert "devices differs" in devices.difference()
    sub = Step("w", "c", "n1", allocated(result("r/a", "d1")), allocated(result("r/b", "d1")))
    assert not sub.subrequests_agree and "subrequest differs" in sub.difference()
    status = Step(
        "w",
        "c",
        "n1",
        Outcome(UNSCHEDULABLE),
        allocated(result("r", "d1")),
        note="allocated on a retry",
    )
    assert "status differs" in status.difference()
    assert status.difference().endswith("[allocated on a retry]")
    both_failed = Step("w", "c", "n1", Outcome(UNSCHEDULABLE, message="x"), Outcome(UNSCHEDULABLE))
    assert both_failed.agrees

    figures = agreement([same, order, devices, sub, status, both_failed])
    assert (figures.steps, figures.agreed, figures.subrequests_agreed) == (6, 3, 4)
    assert figures.allocated == 4
    assert abs(figures.rate - 0.5) < 1e-9
    assert "3/6 steps agree (50.0%)" in figures.line("mixed")
    assert agreement([]).rate == 1.0


def test_model_outcome_on_slices_with_allocated_claims() -> None:
    devices = [
        mig("gpu-0-mig-3g-4", "3g.40gb", [4, 5, 6, 7]),
        mig("gpu-0-mig-3g-0", "3g.40gb", [0, 1, 2, 3]),
        mig("gpu-0-mig-1g-0", "1g.10gb", [0]),
    ]
    slices = [slice_obj("n1-000", "n1", devices)]
    claim = {
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "main",
                        "firstAvailable": [
                            {
                                "name": "big",
                                "deviceClassName": "mig.gpu-slicer.io",
                                "selectors": [
                                    {
                                        "cel": {
                                            "expression": (
                                                'device.attributes["gpu-slicer.io"]'
                                                '.profile == "3g.40gb"'
                                            )
                                        }
                                    }
                                ],
                            },
                            {
                                "name": "small",
                                "deviceClassName": "mig.gpu-slicer.io",
                                "selectors": [
                                    {
                                        "cel": {
                                            "expression": (
                                                'device.attributes["gpu-slicer.io"]'
                                                '.profile == "1g.10gb"'
                                            )
                                        }
                                    }
                                ],
                            },
                        ],
                    }
                ]
            }
        }
    }
    free = model_outcome(
        claim, node="n1", slices=slices, device_classes=CLASSES, allocated_claims=[]
    )
    assert free.describe() == "main/big: gpu-0-mig-3g-4"
    holder = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [result("x", "gpu-0-mig-3g-4"), result("y", "gpu-0-mig-1g-0")]
                }
            }
        }
    }
    # 3g-0 is free but slice 0 is taken by the allocated 1g: no 3g, and no 1g left either.
    assert (
        model_outcome(
            claim, node="n1", slices=slices, device_classes=CLASSES, allocated_claims=[holder]
        ).status
        == UNSCHEDULABLE
    )
    assert (
        model_outcome(
            claim, node="n1", slices=slices, device_classes={}, allocated_claims=[]
        ).status
        == ERROR
    )


def test_timeline_retries_pending_pods_after_departures_from_their_node() -> None:
    spec: Obj = {"devices": {"requests": []}}
    pods = [
        ReplayPod("a", "w", "n1", 0, 100, spec),
        ReplayPod("b", "w", "n1", 10, 100, spec),
        ReplayPod("c", "w", "n2", 20, 50, spec),
    ]
    free = {"n1": 1, "n2": 1}
    log: list[str] = []

    def place(pod: ReplayPod, attempt: int) -> bool:
        ok = free[pod.node] > 0
        free[pod.node] -= ok
        log.append(f"{pod.name}{attempt}{'+' if ok else '-'}")
        return ok

    def release(pod: ReplayPod) -> None:
        free[pod.node] += 1
        log.append(f"~{pod.name}")

    timeline = ReplayOrder(pods)
    timeline.run(place, release)
    # c's departure (t=70) does not retry b (another node); a's (t=100) does.
    assert log == ["a0+", "b0-", "c0+", "~c", "~a", "b1+", "~b"]
    assert timeline.pending == []


def test_workloads_cover_what_the_measurement_needs() -> None:
    noon = noon_burst_pods("noon")
    assert [p.name for p in noon][:3] == ["morning-train", "morning-notebook", "burst-0"]
    assert {p.node for p in noon} == {"noon"}
    nodes = {"a100": "A100-80GB", "a30": "A30-24GB", "h100": "H100-80GB", "h200": "H200-141GB"}
    mixed = mixed_pods(nodes)
    assert len(mixed) >= 50 and mixed == mixed_pods(nodes)
    assert {p.node for p in mixed} == set(nodes)
    requests = [r for p in mixed for r in p.claim_spec["devices"]["requests"]]
    subs = [s for r in requests for s in r.get("firstAvailable", [])]
    assert any(len(r.get("firstAvailable", [])) > 1 for r in requests)
    assert any(int(s.get("count", 1)) > 1 for s in subs)
    assert any(p.claim_spec["devices"].get("constraints") for p in mixed)
    assert any(len(p.claim_spec["devices"]["requests"]) > 1 for p in mixed)
    assert any(s["deviceClassName"] == "gpu.gpu-slicer.io" for s in subs)


def test_claim_spec_for_is_the_webhook_template() -> None:
    spec = claim_spec_for([{"nvidia.com/gpu": 2}])
    (request,) = spec["devices"]["requests"]
    assert [s["name"] for s in request["firstAvailable"]][:2] == ["gpu-nvlink", "gpu"]
    assert spec["devices"]["constraints"][0]["matchAttribute"] == "gpu-slicer.io/nvlinkDomain"
