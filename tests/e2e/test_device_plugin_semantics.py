"""A converted pod needs what it needed under the device plugin, and still finds a place."""

from __future__ import annotations

from tests.support.e2e_sandbox import ENABLED, Sandbox, pod_manifest


def test_an_init_container_and_an_app_container_share_the_one_gpu_of_a_node(
    sandbox: Sandbox,
) -> None:
    node = "one-gpu"
    init = [
        {"name": "warmup", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    ]
    sandbox.create_pod(
        ENABLED, pod_manifest("staged", node=node, limits={"nvidia.com/gpu": "1"}, init=init)
    )
    pod = sandbox.wait_running(ENABLED, "staged")
    [claim] = sandbox.claims_of(pod)
    assert [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]] == ["gpu-0"]
    warmup = sandbox.container_runtime(node, ENABLED, "staged", "warmup")["cdiDevices"]
    main = sandbox.container_runtime(node, ENABLED, "staged", "main")["cdiDevices"]
    assert warmup == main and len(main) == 1
    sandbox.delete_pod(ENABLED, "staged")


def test_a_whole_gpu_on_a_mig_mode_a100_runs_on_the_full_gpu_instance(sandbox: Sandbox) -> None:
    node = "a100-whole"
    assert sandbox.mig_modes(node) == [True]  # Ampere: MIG mode, no whole-GPU device
    sandbox.create_pod(ENABLED, pod_manifest("whole", node=node, limits={"nvidia.com/gpu": "1"}))
    pod = sandbox.wait_running(ENABLED, "whole")
    [claim] = sandbox.claims_of(pod)
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert result["device"] == "gpu-0-mig-7g80gb-0"
    assert sandbox.instances(node) == [(0, "7g.80gb", 0)]
    sandbox.delete_pod(ENABLED, "whole")
    sandbox.wait(lambda: sandbox.instances(node) == [], what="the 7g.80gb instance destroyed")
