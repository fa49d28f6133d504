"""``gpu-slicer uninstall-check``: exits 1 naming the pods while a claim of the driver is
allocated (the chart's pre-delete hook), 0 once none is; waits for claims being released;
refuses when the claims cannot be read."""

from __future__ import annotations

import argparse

import pytest

from gpu_slicer.cli.main import build_parser
from gpu_slicer.kube.errors import Forbidden
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.status import uninstall
from tests.support.status_fixtures import claim, pod


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["uninstall-check", *argv])


def _api(*claims: dict[str, object]) -> InMemoryKubeApi:
    api = InMemoryKubeApi(server_version=(1, 36))
    for c in claims:
        api.create(c)
    api.clear_calls()
    return api


TRAIN = pod("ml", "train")
HELD = claim("ml", "train-gpu-slicer-x", "a100", ["gpu-0-mig-1g10gb-6"], pods=[TRAIN])
OTHER = claim("ml", "nic", "a100", ["eth0"], pods=[pod("ml", "net")], driver="nic.example.com")


def _unallocated(name: str) -> dict[str, object]:
    unallocated = claim("ml", name, "a100", [])
    del unallocated["status"]
    return unallocated


def test_a_claim_of_the_driver_refuses_naming_its_pod_and_node(
    capsys: pytest.CaptureFixture[str],
) -> None:
    api = _api(HELD, OTHER, _unallocated("pending"))
    code = uninstall.run_uninstall_check(_args(), api_factory=lambda _: api)
    assert code == 1
    err = capsys.readouterr().err
    assert "1 claim(s) of z.gpu-slicer.io or gpu-slicer.io still allocated" in err
    assert "  claim ml/train-gpu-slicer-x on a100: pod ml/train\n" in err
    assert "nic" not in err and "pending" not in err
    assert {(c.verb, c.kind) for c in api.calls} == {("list", "ResourceClaim")}


def test_no_claim_of_the_driver_passes(capsys: pytest.CaptureFixture[str]) -> None:
    api = _api(OTHER, _unallocated("pending"))
    assert uninstall.run_uninstall_check(_args(), api_factory=lambda _: api) == 0
    assert "no claim of z.gpu-slicer.io or gpu-slicer.io is allocated" in capsys.readouterr().out


def test_it_waits_for_claims_being_released_then_passes() -> None:
    api = _api(HELD)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if now[0] >= 4:  # the pod's deletion finished: its claim goes
            api.delete("resource.k8s.io/v1", "ResourceClaim", "train-gpu-slicer-x", "ml")

    code = uninstall.run_uninstall_check(
        _args("--wait", "30"), api_factory=lambda _: api, sleep=sleep, monotonic=lambda: now[0]
    )
    assert code == 0
    assert now[0] == 4


def test_it_refuses_after_waiting_when_the_claims_stay() -> None:
    api = _api(HELD)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    code = uninstall.run_uninstall_check(
        _args("--wait", "5"), api_factory=lambda _: api, sleep=sleep, monotonic=lambda: now[0]
    )
    assert code == 1
    assert now[0] == 5


def test_claims_it_cannot_list_refuse_rather_than_pass(capsys: pytest.CaptureFixture[str]) -> None:
    api = _api(HELD)
    api.fail_next("list", Forbidden("resourceclaims is forbidden"))
    assert uninstall.run_uninstall_check(_args(), api_factory=lambda _: api) == 1
    assert "cannot list ResourceClaims: resourceclaims is forbidden" in capsys.readouterr().err


def test_a_negative_wait_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    api = _api()
    assert uninstall.run_uninstall_check(_args("--wait", "-1"), api_factory=lambda _: api) == 2
    assert "--wait must be 0 or more seconds" in capsys.readouterr().err
