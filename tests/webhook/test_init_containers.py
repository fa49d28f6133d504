"""Init containers and sidecars: the claim asks for what the kubelet's device manager reserved.

The rule (docs/translation.md): per kind of device, the pod needs
``max(max over plain init containers i of (count_i + sidecars declared before i),
sidecars + app containers)``; containers that never run at the same time share requests, so an
init container gets devices the app containers use afterwards. Each case is checked four ways:
the device ranges themselves, the translated claim (schema-valid on every Kubernetes version), the
AdmissionReview through the Flask app and ``gpu-slicer convert``, and allocation by the
project's model of the scheduler (``sim.allocator``) against the devices the agent publishes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from flask.testing import FlaskClient
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_slicer.cli.main import main
from gpu_slicer.core import catalog
from gpu_slicer.sim.allocator import allocate_on_node
from gpu_slicer.slicer.deviceclasses import device_classes
from gpu_slicer.slicer.inventory import GpuState, build_slices, default_mode
from gpu_slicer.slicer.simulated import SimulatedBackend
from gpu_slicer.webhook.app import create_app
from gpu_slicer.webhook.config import ServerConfig
from gpu_slicer.webhook.convert import convert_objects
from gpu_slicer.webhook.errors import Denied
from gpu_slicer.webhook.policy import Policy, load_policy
from gpu_slicer.webhook.server import Runtime, build_runtime
from gpu_slicer.webhook.translate import Conversion, device_ranges, translate_pod
from tests.support.server_fixtures import admission_review, patched
from tests.support.webhook_cases import Pod, apply, build_pod, container, validate

GPU = "nvidia.com/gpu"
CLASSES = {c["metadata"]["name"]: c for c in device_classes()}


# --- the rule, written out independently of the code ------------------------------------------


def kubelet_total(members: Sequence[tuple[bool, int]]) -> int:
    """What the kubelet's device manager reserves for one resource (admission facts)."""
    sidecars = 0
    peak = 0
    for runs, count in members:
        if runs:
            sidecars += count
        else:
            peak = max(peak, count + sidecars)
    return max(peak, sidecars)


def concurrent(members: Sequence[tuple[bool, int]], i: int, j: int) -> bool:
    """Whether members ``i`` < ``j`` (start order) ever run at the same time: both run to the
    end, or ``j`` is a plain init container started while sidecar ``i`` runs."""
    return members[i][0]


EXAMPLES = [
    # (members as (runs until the end, count), kubelet's total)
    ([(False, 1), (True, 1)], 1),  # init 1, app 1
    ([(True, 1), (False, 2), (True, 1), (True, 1)], 3),  # sidecar 1, init 2, apps 1 + 1
    ([(True, 1), (False, 3), (True, 1)], 4),  # sidecar 1, init 3, app 1
    ([(False, 2), (True, 1), (True, 1)], 2),  # init 2, sidecar 1, app 1
    ([(False, 1), (False, 3), (False, 2), (True, 1)], 3),  # inits 1, 3, 2 then app 1
    ([(True, 2), (True, 1)], 3),  # no plain init container: everything adds up
]


@pytest.mark.parametrize(("members", "total"), EXAMPLES, ids=[str(m) for m, _t in EXAMPLES])
def test_the_device_ranges_reserve_what_the_kubelet_does(
    members: list[tuple[bool, int]], total: int
) -> None:
    got, ranges = device_ranges(members)
    assert got == total == kubelet_total(members)
    assert [b - a for a, b in ranges] == [count for _runs, count in members]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 5)), min_size=1, max_size=8))
def test_any_device_ranges_are_minimal_and_never_shares_a_device_between_running_containers(
    members: list[tuple[bool, int]],
) -> None:
    total, ranges = device_ranges(members)
    assert total == kubelet_total(members)
    assert all(0 <= a < b <= total for a, b in ranges)
    for j in range(len(members)):
        for i in range(j):
            if concurrent(members, i, j):
                (a, b), (c, d) = ranges[i], ranges[j]
                assert b <= c or d <= a, (members, ranges, i, j)


# --- translation ---------------------------------------------------------------------------------


def gpus(name: str, count: int, *, sidecar: bool = False, resource: str = GPU) -> dict[str, Any]:
    fields: dict[str, Any] = {"restartPolicy": "Always"} if sidecar else {}
    return container(name, limits={resource: count}, **fields)


def translated(pod: Pod, policy: Policy | None = None) -> Conversion:
    conversion = translate_pod(pod, namespace="ml", policy=policy or Policy.default())
    (template,) = conversion.templates
    validate(template)
    validate(apply(pod, conversion))
    return conversion


def devices_of(conversion: Conversion) -> dict[str, int]:
    """Request name -> device count of the claim."""
    (template,) = conversion.templates
    out = {}
    for request in template["spec"]["spec"]["devices"]["requests"]:
        alts = request.get("firstAvailable") or [request["exactly"]]
        counts = {a["count"] for a in alts}
        assert len(counts) == 1, "every alternative of a request asks for the same count"
        out[request["name"]] = counts.pop()
    return out


def references(pod: Pod, conversion: Conversion) -> dict[str, list[str]]:
    """Container name -> the requests of the claim it references."""
    spec = apply(pod, conversion)["spec"]
    found = {}
    for kind in ("initContainers", "containers"):
        for body in spec.get(kind, []):
            claims = body.get("resources", {}).get("claims", [])
            assert all(c["name"] == "gpu-slicer" for c in claims)
            found[body["name"]] = [c["request"] for c in claims]
    return found


def check_pod(pod: Pod, policy: Policy | None = None) -> Conversion:
    """The claim holds what the kubelet reserves; each container sees exactly its count; no two
    containers that run at the same time share a request."""
    conversion = translated(pod, policy)
    counts = devices_of(conversion)
    refs = references(pod, conversion)
    spec = pod["spec"]
    ordered = [*spec.get("initContainers", []), *spec["containers"]]
    by_resource: dict[str, list[tuple[str, bool, int]]] = {}
    for index, body in enumerate(ordered):
        limits = body.get("resources", {}).get("limits", {})
        runs = index >= len(spec.get("initContainers", [])) or body.get("restartPolicy") == "Always"
        for resource, count in limits.items():
            by_resource.setdefault(resource, []).append((body["name"], runs, int(count)))
            assert sum(counts[r] for r in refs[body["name"]]) == int(count), body["name"]
    expected = sum(kubelet_total([(r, c) for _n, r, c in m]) for m in by_resource.values())
    assert sum(counts.values()) == expected
    for members in by_resource.values():
        shape = [(r, c) for _n, r, c in members]
        for j in range(len(members)):
            for i in range(j):
                if concurrent(shape, i, j):
                    shared = set(refs[members[i][0]]) & set(refs[members[j][0]])
                    assert not shared, (members[i][0], members[j][0], shared)
    return conversion


def test_an_init_container_uses_the_gpu_the_app_container_uses_afterwards() -> None:
    pod = build_pod(gpus("main", 1), init=[gpus("setup", 1)])
    conversion = check_pod(pod)
    assert devices_of(conversion) == {"main": 1}
    assert references(pod, conversion) == {"setup": ["main"], "main": ["main"]}


def test_several_init_containers_of_different_sizes_need_only_the_largest() -> None:
    pod = build_pod(gpus("main", 1), init=[gpus("fetch", 1), gpus("compile", 3), gpus("warm", 2)])
    conversion = check_pod(pod)
    assert sum(devices_of(conversion).values()) == 3
    refs = references(pod, conversion)
    # the documented example (docs/translation.md) is exactly this claim
    assert devices_of(conversion) == {"compile": 2, "main": 1}
    assert refs == {
        "fetch": ["main"],
        "compile": ["main", "compile"],
        "warm": ["compile"],
        "main": ["main"],
    }


def test_a_sidecar_adds_to_the_app_containers_and_runs_beside_later_init_containers() -> None:
    pod = build_pod(gpus("app", 1), init=[gpus("proxy", 1, sidecar=True), gpus("setup", 3)])
    conversion = check_pod(pod)
    assert sum(devices_of(conversion).values()) == 4
    refs = references(pod, conversion)
    assert "proxy" not in refs["setup"]


def test_an_init_container_before_a_sidecar_may_reuse_the_sidecar_devices() -> None:
    pod = build_pod(gpus("app", 1), init=[gpus("setup", 2), gpus("proxy", 1, sidecar=True)])
    conversion = check_pod(pod)
    assert sum(devices_of(conversion).values()) == 2
    assert references(pod, conversion)["setup"] == ["proxy", "app"]


def test_mig_profiles_are_shared_per_profile_and_kinds_never_mix() -> None:
    pod = build_pod(
        gpus("main", 1, resource="nvidia.com/mig-1g.10gb"),
        gpus("tool", 1),
        init=[gpus("setup", 2, resource="nvidia.com/mig-1g.10gb"), gpus("check", 1)],
    )
    conversion = check_pod(pod)
    # 2 slices for setup then main, 1 whole GPU for check then tool
    assert sorted(devices_of(conversion).values()) == [1, 1, 1]
    refs = references(pod, conversion)
    assert set(refs["check"]) == set(refs["tool"])
    assert not set(refs["setup"]) & set(refs["tool"])


def test_a_split_container_keeps_one_nvlink_constraint_over_all_its_requests() -> None:
    pod = build_pod(gpus("main", 1), init=[gpus("setup", 4)])
    conversion = check_pod(pod)
    (template,) = conversion.templates
    (constraint,) = template["spec"]["spec"]["devices"]["constraints"]
    assert sorted(constraint["requests"]) == sorted(
        [f"{r}/{s}" for r in ("main", "setup") for s in ("gpu-nvlink", "gpu-mig-nvlink")]
    )


def test_the_converted_record_lists_every_request_of_a_split_container() -> None:
    pod = build_pod(gpus("main", 1), init=[gpus("setup", 2)])
    conversion = check_pod(pod)
    annotations = apply(pod, conversion)["metadata"]["annotations"]
    record = json.loads(annotations["gpu-slicer.io/converted"])
    by_name = {c["container"]: c for c in record["containers"]}
    assert by_name["setup"]["requests"] == ["main", "setup"]
    assert by_name["main"]["request"] == "main"
    assert by_name["setup"]["to"][0] == "2 x gpu (nvlink)"


def test_converting_twice_adds_nothing() -> None:
    pod = build_pod(gpus("main", 1), init=[gpus("setup", 3)])
    once = apply(pod, translated(pod))
    assert translate_pod(once, namespace="ml", policy=Policy.default()).patch == []


def test_a_pod_with_over_32_sidecars_and_apps_is_denied_before_the_rest_is_read() -> None:
    apps = [gpus(f"c{i}", 1) for i in range(100)]
    # container 40 is malformed: reading it would be denied with another message
    apps[40]["resources"]["requests"] = {GPU: 2}
    with pytest.raises(Denied) as info:
        translate_pod(build_pod(*apps), namespace="ml", policy=Policy.default())
    assert "more than 32 app containers and sidecars" in info.value.message
    assert "'c32'" in info.value.message


def test_many_init_containers_share_and_are_not_counted_as_requests() -> None:
    inits = [gpus(f"i{i}", 1) for i in range(40)]
    conversion = check_pod(build_pod(gpus("main", 1), init=inits))
    assert devices_of(conversion) == {"main": 1}


# --- allocation on the devices the agent publishes -------------------------------------------


def node_slices(node: str, *models: str) -> list[dict[str, Any]]:
    backend = SimulatedBackend(list(models))
    states = [
        GpuState(info=i, mode=default_mode(catalog.get_model(i.model))) for i in backend.gpus()
    ]
    return build_slices(node, states)


def allocate(conversion: Conversion, slices: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(request, device) the scheduler's model chooses, or [] when the pod cannot fit."""
    (template,) = conversion.templates
    claim = {"metadata": {"name": "c"}, "spec": template["spec"]["spec"]}
    result = allocate_on_node([claim], node_name="node-a", slices=slices, device_classes=CLASSES)
    if result is None:
        return []
    return [
        (r["request"], r["device"]) for a in result.allocations for r in a["devices"]["results"]
    ]


def test_an_init_and_app_pod_fits_on_a_one_gpu_node() -> None:
    pod = build_pod(gpus("main", 1), init=[gpus("setup", 1)])
    chosen = allocate(check_pod(pod), node_slices("node-a", "H100-80GB"))
    assert chosen == [("main/gpu", "gpu-0")]


def test_the_old_one_request_per_container_would_not_have_fit() -> None:
    """The regression: two requests of one GPU each cannot both be served by one GPU."""
    pod = build_pod(gpus("main", 1), gpus("other", 1))
    assert allocate(check_pod(pod), node_slices("node-a", "H100-80GB")) == []


def test_one_gpu_on_an_a100_in_mig_mode_runs_on_the_full_gpu_instance() -> None:
    pod = build_pod(gpus("main", 1))
    chosen = allocate(check_pod(pod), node_slices("node-a", "A100-80GB"))
    assert chosen == [("main/gpu-mig", "gpu-0-mig-7g80gb-0")]


def test_an_a30_in_mig_mode_serves_a_whole_gpu_as_its_4g_instance() -> None:
    chosen = allocate(check_pod(build_pod(gpus("main", 1))), node_slices("node-a", "A30-24GB"))
    assert chosen == [("main/gpu-mig", "gpu-0-mig-4g24gb-0")]


def test_two_gpus_on_a100s_in_mig_mode_take_two_full_instances_nvlinked_first() -> None:
    slices = node_slices("node-a", "A100-80GB", "A100-80GB")
    chosen = allocate(check_pod(build_pod(gpus("main", 2))), slices)
    assert sorted(chosen) == [
        ("main/gpu-mig-nvlink", "gpu-0-mig-7g80gb-0"),
        ("main/gpu-mig-nvlink", "gpu-1-mig-7g80gb-0"),
    ]


def test_a_whole_gpu_is_still_preferred_where_one_is_published() -> None:
    slices = node_slices("node-a", "A100-80GB", "H100-80GB")
    chosen = allocate(check_pod(build_pod(gpus("main", 1))), slices)
    assert chosen == [("main/gpu", "gpu-1")]


def test_full_gpu_mig_false_keeps_nvidia_gpu_off_mig_mode_nodes() -> None:
    policy = load_policy("fullGpuMig: false")
    conversion = check_pod(build_pod(gpus("main", 1)), policy)
    assert allocate(conversion, node_slices("node-a", "A100-80GB")) == []


def test_the_full_gpu_alternative_uses_only_the_policy_models() -> None:
    policy = load_policy("gpuModels: [A100-80GB, A30-24GB]")
    conversion = check_pod(build_pod(gpus("main", 1)), policy)
    (template,) = conversion.templates
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    expression = request["firstAvailable"][1]["selectors"][0]["cel"]["expression"]
    assert expression.endswith('.profile in ["7g.80gb", "4g.24gb"]')


def test_init_containers_of_mig_slices_fit_where_the_sum_would_not() -> None:
    # one A30: at most one 4g.24gb; init and app each ask for it
    pod = build_pod(
        gpus("main", 1, resource="nvidia.com/mig-4g.24gb"),
        init=[gpus("setup", 1, resource="nvidia.com/mig-4g.24gb")],
    )
    chosen = allocate(check_pod(pod), node_slices("node-a", "A30-24GB"))
    assert chosen == [("main", "gpu-0-mig-4g24gb-0")]


# --- through the server and through convert ------------------------------------------------------


@pytest.fixture
def client() -> Iterator[FlaskClient]:
    runtime: Runtime = build_runtime(ServerConfig(dev=True, gc_interval_s=0))
    yield create_app(runtime=runtime).test_client()
    runtime.stop()


def test_an_admission_review_shares_the_init_container_gpu(client: FlaskClient) -> None:
    pod = build_pod(gpus("main", 1), init=[gpus("setup", 1)], name=None)
    reply = client.post(
        "/mutate-pods",
        data=json.dumps(admission_review(pod)),
        headers={"Content-Type": "application/json"},
    )
    response = reply.get_json()["response"]
    assert response["allowed"] is True
    result = patched(pod, response)
    assert result["spec"]["initContainers"][0]["resources"] == {
        "claims": [{"name": "gpu-slicer", "request": "main"}]
    }
    validate(result)


def test_convert_shares_the_init_container_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {
            "selector": {"matchLabels": {"app": "train"}},
            "template": {
                "metadata": {"labels": {"app": "train"}},
                "spec": build_pod(gpus("main", 1), init=[gpus("setup", 2)])["spec"],
            },
        },
    }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(deployment))
    assert main(["convert", str(path)]) == 0
    deployment_out, template = list(yaml.safe_load_all(capsys.readouterr().out))
    spec = deployment_out["spec"]["template"]["spec"]
    assert spec["initContainers"][0]["resources"]["claims"] == [
        {"name": "gpu-slicer", "request": "main"},
        {"name": "gpu-slicer", "request": "setup"},
    ]
    requests = template["spec"]["spec"]["devices"]["requests"]
    counts = [r["firstAvailable"][0]["count"] for r in requests]
    assert sum(counts) == 2
    validate(template)
    assert convert_objects([deployment_out], policy=Policy.default()).templates == []
