"""translate_pod: the translation rules (docs/translation.md) and the admission bug classes."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_slicer.core import catalog
from gpu_slicer.core.identity import CONVERTED_ANNOTATION
from gpu_slicer.webhook import claims
from gpu_slicer.webhook.errors import Denied
from gpu_slicer.webhook.policy import ALL_MODELS, Policy, full_gpu_profiles, load_policy
from gpu_slicer.webhook.translate import (
    Conversion,
    audit_warnings,
    converted_annotation,
    translate_pod,
)
from tests.support.webhook_cases import Pod, apply, build_pod, container, validate

Translate = Callable[..., Conversion]

FULL = "|".join(full_gpu_profiles(ALL_MODELS))
"""What ``chain`` shows for the alternative of MIG instances that span a GPU, every model."""


def requests_of(conversion: Conversion) -> list[dict[str, Any]]:
    (template,) = conversion.templates
    return template["spec"]["spec"]["devices"]["requests"]  # type: ignore[no-any-return]


def constraints_of(conversion: Conversion) -> list[dict[str, Any]]:
    (template,) = conversion.templates
    return template["spec"]["spec"]["devices"].get("constraints", [])  # type: ignore[no-any-return]


def chain(request: dict[str, Any]) -> list[tuple[str, int, str]]:
    """(class, count, profile or "") of each alternative of a request."""
    alts = request["firstAvailable"] if "firstAvailable" in request else [request["exactly"]]
    out = []
    for alt in alts:
        expression = alt.get("selectors", [{"cel": {"expression": ""}}])[0]["cel"]["expression"]
        if ".profile in [" in expression:
            listed = expression.split(".profile in [")[1].split("]")[0]
            profile = "|".join(p.strip().strip('"') for p in listed.split(","))
        elif ".profile ==" in expression:
            profile = expression.split(".profile == ")[1].split('"')[1]
        else:
            profile = ""
        out.append((alt["deviceClassName"], alt["count"], profile))
    return out


def profiles(request: dict[str, Any]) -> list[str]:
    return [p or "gpu" for _c, _n, p in chain(request)]


def denied(translate: Translate, pod: Pod, **kwargs: Any) -> str:
    with pytest.raises(Denied) as info:
        translate(pod, **kwargs)
    return str(info.value.message)


# --- whole GPUs ---------------------------------------------------------------------------


def test_one_gpu_becomes_one_whole_gpu_request(translate: Translate) -> None:
    conversion = translate(build_pod(container(limits={"nvidia.com/gpu": 1})))
    (request,) = requests_of(conversion)
    assert request["name"] == "main"
    # then the MIG instance that spans a GPU, for nodes whose GPUs run in MIG mode
    assert chain(request) == [("gpu.gpu-slicer.io", 1, ""), ("mig.gpu-slicer.io", 1, FULL)]
    assert [s["name"] for s in request["firstAvailable"]] == ["gpu", "gpu-mig"]
    assert constraints_of(conversion) == []
    assert conversion.changes == [("main", "nvidia.com/gpu")]


def test_several_gpus_try_an_nvlink_domain_first_then_any(translate: Translate) -> None:
    conversion = translate(build_pod(container(limits={"nvidia.com/gpu": "4"})))
    (request,) = requests_of(conversion)
    assert [s["name"] for s in request["firstAvailable"]] == [
        "gpu-nvlink",
        "gpu",
        "gpu-mig-nvlink",
        "gpu-mig",
    ]
    assert chain(request) == [
        ("gpu.gpu-slicer.io", 4, ""),
        ("gpu.gpu-slicer.io", 4, ""),
        ("mig.gpu-slicer.io", 4, FULL),
        ("mig.gpu-slicer.io", 4, FULL),
    ]
    # the constraint names the NVLink subrequests, so the plain fallbacks stay unconstrained
    assert constraints_of(conversion) == [
        {
            "requests": ["main/gpu-nvlink", "main/gpu-mig-nvlink"],
            "matchAttribute": "gpu-slicer.io/nvlinkDomain",
        }
    ]


def test_the_structured_requests_mirror_the_template(translate: Translate) -> None:
    pod = build_pod(
        container(limits={"nvidia.com/gpu": "2"}),
        container("sidecar", limits={"nvidia.com/mig-1g.10gb": 1}),
    )
    conversion = translate(pod)
    assert [r.name for r in conversion.requests] == [r["name"] for r in requests_of(conversion)]
    assert [
        [(a.kind, a.count, a.profile or "", a.nvlink) for a in r.alternatives]
        for r in conversion.requests
    ] == [
        [("gpu", 2, "", True), ("gpu", 2, "", False), ("mig", 2, "", True), ("mig", 2, "", False)],
        [("mig", 1, "1g.10gb", False)],
    ]


def test_strict_nvlink_asks_only_for_connected_gpus() -> None:
    policy = load_policy("nvlink: strict\nfullGpuMig: false")
    conversion = translate_pod(
        build_pod(container(limits={"nvidia.com/gpu": 2})), namespace="ml", policy=policy
    )
    (request,) = requests_of(conversion)
    assert request["exactly"]["count"] == 2
    assert constraints_of(conversion) == [
        {"requests": ["main"], "matchAttribute": "gpu-slicer.io/nvlinkDomain"}
    ]


def test_nvlink_none_asks_for_any_gpus() -> None:
    policy = load_policy("namespaces: {ml: {nvlink: none}}")
    conversion = translate_pod(
        build_pod(container(limits={"nvidia.com/gpu": 2})), namespace="ml", policy=policy
    )
    (request,) = requests_of(conversion)
    assert chain(request) == [("gpu.gpu-slicer.io", 2, ""), ("mig.gpu-slicer.io", 2, FULL)]
    assert constraints_of(conversion) == []


def test_the_nvidia_target_uses_nvidia_classes_and_warns_that_nvlink_is_not_expressible() -> None:
    policy = load_policy("target: nvidia")
    conversion = translate_pod(
        build_pod(container(limits={"nvidia.com/gpu": 2})), namespace="ml", policy=policy
    )
    (request,) = requests_of(conversion)
    assert chain(request) == [("gpu.nvidia.com", 2, ""), ("mig.nvidia.com", 2, FULL)]
    assert constraints_of(conversion) == []
    assert any("NVLink" in w for w in conversion.warnings)


# --- MIG profiles -------------------------------------------------------------------------


def test_a_mig_request_becomes_slices_of_that_profile(translate: Translate) -> None:
    conversion = translate(build_pod(container(limits={"nvidia.com/mig-1g.10gb": 2})))
    (request,) = requests_of(conversion)
    assert chain(request) == [("mig.gpu-slicer.io", 2, "1g.10gb")]


def test_mig_fallback_larger_adds_bigger_profiles_smallest_first() -> None:
    policy = load_policy("migFallback: larger")
    conversion = translate_pod(
        build_pod(container(limits={"nvidia.com/mig-3g.40gb": 1})), namespace="ml", policy=policy
    )
    (request,) = requests_of(conversion)
    assert profiles(request) == ["3g.40gb", "4g.40gb", "7g.80gb"]


def test_mig_fallback_larger_never_exceeds_eight_alternatives() -> None:
    policy = load_policy("migFallback: larger")
    conversion = translate_pod(
        build_pod(container(limits={"nvidia.com/mig-1g.5gb": 1})), namespace="ml", policy=policy
    )
    (request,) = requests_of(conversion)
    names = profiles(request)
    assert names[0] == "1g.5gb"
    assert 1 < len(names) <= 8
    assert not any(n.endswith("+me") for n in names)


def test_explicit_mig_fallbacks_win_over_the_mode() -> None:
    policy = load_policy("migFallback: {mode: larger, explicit: {1g.10gb: [2g.20gb, gpu]}}")
    conversion = translate_pod(
        build_pod(container(limits={"nvidia.com/mig-1g.10gb": 1})), namespace="ml", policy=policy
    )
    (request,) = requests_of(conversion)
    assert chain(request) == [
        ("mig.gpu-slicer.io", 1, "1g.10gb"),
        ("mig.gpu-slicer.io", 1, "2g.20gb"),
        ("gpu.gpu-slicer.io", 1, ""),
    ]


def test_an_unknown_mig_profile_is_denied_with_the_valid_ones(translate: Translate) -> None:
    message = denied(translate, build_pod(container(limits={"nvidia.com/mig-9g.1tb": 1})))
    assert "9g.1tb" in message
    assert "`gpu-slicer catalog`" in message and "1g.10gb" not in message
    typo = denied(translate, build_pod(container(limits={"nvidia.com/mig-1g.10g": 1})))
    assert "did you mean '1g.10gb'" in typo
    assert "7g.80gb" not in typo


# --- requests, limits and counts ----------------------------------------------------------


@pytest.mark.parametrize("section", ["requests", "limits", "both"])
def test_the_legacy_resource_is_removed_wherever_it_appears(
    translate: Translate, section: str
) -> None:
    resources = {"nvidia.com/gpu": "1", "cpu": "2"}
    limits = resources if section in ("limits", "both") else {"cpu": "2"}
    requests = resources if section in ("requests", "both") else {"cpu": "2"}
    pod = build_pod(container(limits=limits, requests=requests))
    patched = apply(pod, translate(pod))
    got = patched["spec"]["containers"][0]["resources"]
    assert got["limits"] == {"cpu": "2"}
    assert got["requests"] == {"cpu": "2"}
    assert got["claims"] == [{"name": "gpu-slicer", "request": "main"}]


def test_an_emptied_resource_map_is_dropped(translate: Translate) -> None:
    pod = build_pod(container(limits={"nvidia.com/gpu": 1}, requests={"nvidia.com/gpu": 1}))
    resources = apply(pod, translate(pod))["spec"]["containers"][0]["resources"]
    assert resources == {"claims": [{"name": "gpu-slicer", "request": "main"}]}


def test_requests_and_limits_that_differ_are_denied(translate: Translate) -> None:
    pod = build_pod(container(limits={"nvidia.com/gpu": 2}, requests={"nvidia.com/gpu": 1}))
    assert "1 in requests but 2 in limits" in denied(translate, pod)


@pytest.mark.parametrize("value", ["1.5", "500m", "-1", "two", True, None, [1]])
def test_a_count_that_is_not_a_whole_number_is_denied(translate: Translate, value: Any) -> None:
    pod = build_pod(container(limits={"nvidia.com/gpu": value}))
    assert "nvidia.com/gpu" in denied(translate, pod)


def test_a_zero_count_is_left_alone(translate: Translate) -> None:
    conversion = translate(build_pod(container(limits={"nvidia.com/gpu": "0"})))
    assert conversion.patch == []


def test_two_gpu_resources_in_one_container_are_denied(translate: Translate) -> None:
    pod = build_pod(container(limits={"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 1}))
    assert "one GPU resource per container" in denied(translate, pod)


def test_other_nvidia_resources_are_not_gpu_requests(translate: Translate) -> None:
    conversion = translate(build_pod(container(limits={"nvidia.com/gpu.shared": 1})))
    assert conversion.patch == []


# --- annotations ----------------------------------------------------------------------------


def test_the_profiles_annotation_gives_the_chain_in_order(translate: Translate) -> None:
    pod = build_pod(
        container(limits={"nvidia.com/gpu": 1}),
        annotations={"gpu-slicer.io/profiles": "1g.10gb, 2g.20gb,gpu"},
    )
    conversion = translate(pod)
    (request,) = requests_of(conversion)
    assert profiles(request) == ["1g.10gb", "2g.20gb", "gpu"]
    assert [s["name"] for s in request["firstAvailable"]] == ["1g-10gb", "2g-20gb", "gpu"]
    record = converted_annotation(apply(pod, conversion))
    assert record is not None
    assert record["containers"][0]["via"] == "gpu-slicer.io/profiles"


def test_annotations_without_legacy_requests_go_to_the_first_container(
    translate: Translate,
) -> None:
    pod = build_pod(
        container("app"),
        container("sidecar"),
        annotations={"gpu-slicer.io/profiles": "2g.20gb"},
    )
    conversion = translate(pod)
    (request,) = requests_of(conversion)
    assert request["name"] == "app"
    assert conversion.changes == [("app", "annotation")]
    patched = apply(pod, conversion)
    assert "resources" not in patched["spec"]["containers"][1]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1g.10gb,9g.1tb", "unknown profile '9g.1tb'"),
        ("1g.10gb,,2g.20gb", "empty entry"),
        ("1g.10gb,1g.10gb", "lists a profile twice"),
        ("1g.5gb,1g.10gb,2g.10gb,3g.20gb,4g.20gb,7g.40gb,1g.20gb,2g.20gb,3g.40gb", "at most 8"),
        ('1g.10gb" || true', "unknown profile"),
    ],
)
def test_a_bad_profiles_annotation_is_denied_with_what_is_valid(
    translate: Translate, value: str, message: str
) -> None:
    pod = build_pod(container(), annotations={"gpu-slicer.io/profiles": value})
    assert message in denied(translate, pod)


def test_the_memory_annotation_builds_the_smallest_fitting_chain(translate: Translate) -> None:
    pod = build_pod(container(), annotations={"gpu-slicer.io/gpu-memory": "12Gi"})
    (request,) = requests_of(translate(pod))
    tiers = [set(entry.split("|")) for entry in profiles(request)]
    assert 1 < len(tiers) <= 8
    # every model's smallest fitting profile comes first: the 12 GB profiles have a little less
    # than 12 GiB, so an H200's is 1g.18gb and an H100 80GB's 1g.20gb
    assert {"1g.18gb", "1g.20gb"} <= tiers[0] and "1g.12gb" not in set().union(*tiers)
    # on an A100 80GB: its fitting profiles, one per tier, smallest first, then nothing
    a100 = [p for p in catalog.get_model("A100-80GB").profiles if not p.media_exclusive]
    fitting = [
        p.name for p in sorted(a100, key=lambda p: p.memory_bytes) if p.memory_bytes >= 12 * 2**30
    ]
    offered = [sorted(t & {p.name for p in a100}) for t in tiers]
    assert offered == [[name] for name in fitting] + [[]] * (len(tiers) - len(fitting))
    assert fitting[0] == "1g.20gb"


def test_every_entry_of_a_memory_chain_selects_on_the_memory_the_node_publishes(
    translate: Translate,
) -> None:
    # The catalog's figure only picks candidates: a profile's memory differs by driver, and the
    # agent publishes what NVML reports, so each subrequest also checks the device's capacity.
    pod = build_pod(container(), annotations={"gpu-slicer.io/gpu-memory": "19712Mi"})
    (request,) = requests_of(translate(pod))
    expressions = [s["selectors"][0]["cel"]["expression"] for s in request["firstAvailable"]]
    assert expressions
    for expression in expressions:
        assert '.memory.compareTo(quantity("19712Mi")) >= 0' in expression


H100_A100 = load_policy("gpuModels: [H100-80GB, A100-80GB]")
"""A cluster of H100 80GB and A100 80GB nodes: the profiles of other models cannot be served."""


def test_a_memory_chain_uses_only_the_policy_gpu_models_and_reaches_larger_slices() -> None:
    pod = build_pod(container(), annotations={"gpu-slicer.io/gpu-memory": "15Gi"})
    everywhere = profiles(requests_of(translate_pod(pod, namespace="ml", policy=Policy()))[0])
    # the whole catalog: tiers of many models' profiles (1g.18gb is an H200's, 3g.71gb too)
    assert "1g.18gb" in everywhere[0].split("|") and len(everywhere[0].split("|")) > 2
    (request,) = requests_of(translate_pod(pod, namespace="ml", policy=H100_A100))
    assert profiles(request) == ["1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]


def test_a_namespace_gpu_models_list_decides_its_memory_chains() -> None:
    policy = load_policy(
        "gpuModels: [H100-80GB, A100-80GB]\nnamespaces: {big: {gpuModels: [H200-141GB]}}"
    )
    pod = build_pod(container(), annotations={"gpu-slicer.io/gpu-memory": "15Gi"})
    (big,) = requests_of(translate_pod(pod, namespace="big", policy=policy))
    (ml,) = requests_of(translate_pod(pod, namespace="ml", policy=policy))
    assert profiles(big) == ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]
    assert profiles(ml)[0] == "1g.20gb"


def test_mig_fallback_larger_uses_only_the_policy_gpu_models() -> None:
    policy = load_policy("gpuModels: [H100-80GB, A100-80GB]\nmigFallback: larger")
    pod = build_pod(container(limits={"nvidia.com/mig-1g.10gb": 1}))
    (request,) = requests_of(translate_pod(pod, namespace="ml", policy=policy))
    assert profiles(request) == ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]


@pytest.mark.parametrize(
    "pod",
    [
        build_pod(container(), annotations={"gpu-slicer.io/profiles": "1g.10gb,1g.18gb"}),
        build_pod(container(limits={"nvidia.com/mig-1g.18gb": 1})),
    ],
    ids=["profiles annotation", "legacy MIG resource"],
)
def test_a_profile_no_policy_gpu_model_offers_is_denied_with_the_valid_ones(pod: Pod) -> None:
    with pytest.raises(Denied) as info:
        translate_pod(pod, namespace="ml", policy=H100_A100)
    message = info.value.message
    assert "'1g.18gb'" in message and "A100-80GB, H100-80GB" in message
    # the nearest of the models' own profiles, not every profile of the catalog
    assert "did you mean '1g.10gb'" in message or "did you mean '1g.20gb'" in message
    assert "1g.12gb" not in message and "3g.40gb" not in message


def test_a_memory_beyond_the_policy_gpu_models_names_their_largest_profile() -> None:
    pod = build_pod(container(), annotations={"gpu-slicer.io/gpu-memory": "100Gi"})
    with pytest.raises(Denied) as info:
        translate_pod(pod, namespace="ml", policy=H100_A100)
    assert "the largest is 7g.80gb" in info.value.message


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1Ti", "the largest is 7g.278gb"),
        ("12GB", "not a quantity"),
        ("-1Gi", "not a positive memory size"),
        ("", "not a quantity"),
    ],
)
def test_a_bad_memory_annotation_is_denied(translate: Translate, value: str, message: str) -> None:
    pod = build_pod(container(), annotations={"gpu-slicer.io/gpu-memory": value})
    assert message in denied(translate, pod)


def test_profiles_and_memory_annotations_together_are_denied(translate: Translate) -> None:
    pod = build_pod(
        container(),
        annotations={"gpu-slicer.io/profiles": "1g.10gb", "gpu-slicer.io/gpu-memory": "10Gi"},
    )
    assert "use one" in denied(translate, pod)


def test_the_containers_annotation_chooses_who_gets_the_chain(translate: Translate) -> None:
    pod = build_pod(
        container("a"),
        container("b"),
        container("c"),
        annotations={"gpu-slicer.io/profiles": "1g.10gb", "gpu-slicer.io/containers": "c, a"},
    )
    conversion = translate(pod)
    assert sorted(r["name"] for r in requests_of(conversion)) == ["a", "c"]
    patched = apply(pod, conversion)
    assert "resources" not in patched["spec"]["containers"][1]


def test_an_unknown_container_name_is_denied_with_the_pod_containers(translate: Translate) -> None:
    pod = build_pod(
        container("a"),
        init=[container("setup")],
        annotations={"gpu-slicer.io/containers": "a,nope"},
    )
    message = denied(translate, pod)
    assert "'nope'" in message and "setup, a" in message


def test_an_ephemeral_container_cannot_be_named(translate: Translate) -> None:
    pod = build_pod(
        container("a"),
        ephemeralContainers=[{"name": "debug", "image": "busybox"}],
        annotations={"gpu-slicer.io/containers": "debug"},
    )
    assert "no container named 'debug'" in denied(translate, pod)


def test_the_containers_annotation_alone_gives_what_one_gpu_means(
    embeddings_policy: Policy,
) -> None:
    pod = build_pod(container("a"), container("b"), annotations={"gpu-slicer.io/containers": "b"})
    conversion = translate_pod(pod, namespace="embeddings", policy=embeddings_policy)
    (request,) = requests_of(conversion)
    assert request["name"] == "b"
    assert profiles(request) == ["1g.10gb", "2g.20gb", "3g.40gb"]


# --- policy ----------------------------------------------------------------------------------


def test_a_namespace_can_right_size_whole_gpus(embeddings_policy: Policy) -> None:
    pod = build_pod(container(limits={"nvidia.com/gpu": 1}))
    conversion = translate_pod(pod, namespace="embeddings", policy=embeddings_policy)
    (request,) = requests_of(conversion)
    assert chain(request) == [
        ("mig.gpu-slicer.io", 1, "1g.10gb"),
        ("mig.gpu-slicer.io", 1, "2g.20gb"),
        ("mig.gpu-slicer.io", 1, "3g.40gb"),
    ]
    other = translate_pod(pod, namespace="ml", policy=embeddings_policy)
    assert chain(requests_of(other)[0]) == [
        ("gpu.gpu-slicer.io", 1, ""),
        ("mig.gpu-slicer.io", 1, FULL),
    ]


def test_defer_leaves_names_a_device_class_serves_to_the_scheduler(translate: Translate) -> None:
    pod = build_pod(container(limits={"nvidia.com/gpu": 1}))
    conversion = translate(pod, native_extended=frozenset({"nvidia.com/gpu"}))
    assert conversion.patch == []
    assert any("not converted: a DeviceClass serves it" in w for w in conversion.warnings)
    mig = build_pod(container(limits={"nvidia.com/mig-1g.10gb": 1}))
    assert translate(mig, native_extended=frozenset({"nvidia.com/gpu"})).patch != []


def test_defer_also_keeps_annotations_off_deferred_containers(translate: Translate) -> None:
    pod = build_pod(
        container(limits={"nvidia.com/gpu": 1}),
        annotations={"gpu-slicer.io/containers": "main", "gpu-slicer.io/profiles": "1g.10gb"},
    )
    conversion = translate(pod, native_extended=frozenset({"nvidia.com/gpu"}))
    assert conversion.patch == []


def test_defer_skips_only_the_containers_the_scheduler_serves(translate: Translate) -> None:
    pod = build_pod(
        container("served", limits={"nvidia.com/gpu": 1}),
        container("helper"),
        annotations={
            "gpu-slicer.io/containers": "served,helper",
            "gpu-slicer.io/profiles": "1g.10gb",
        },
    )
    conversion = translate(pod, native_extended=frozenset({"nvidia.com/gpu"}))
    assert conversion.changes == [("helper", "annotation")]
    patched = apply(pod, conversion)
    assert patched["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}


def test_convert_converts_names_a_device_class_serves() -> None:
    policy = load_policy("nativeExtendedResources: convert")
    pod = build_pod(container(limits={"nvidia.com/gpu": 1}))
    conversion = translate_pod(
        pod, namespace="ml", policy=policy, native_extended=frozenset({"nvidia.com/gpu"})
    )
    assert conversion.changes == [("main", "nvidia.com/gpu")]


# --- the pod around the conversion ----------------------------------------------------------


def test_existing_resource_claims_are_kept(translate: Translate) -> None:
    mine = {"name": "scratch", "resourceClaimTemplateName": "fast-disk"}
    pod = build_pod(container(limits={"nvidia.com/gpu": 1}), resourceClaims=[mine])
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "scratch"}]
    patched = apply(pod, translate(pod))
    assert patched["spec"]["resourceClaims"][0] == mine
    assert patched["spec"]["resourceClaims"][1]["name"] == "gpu-slicer"
    assert patched["spec"]["containers"][0]["resources"]["claims"] == [
        {"name": "scratch"},
        {"name": "gpu-slicer", "request": "main"},
    ]


def test_the_converted_annotation_is_added_next_to_existing_ones(translate: Translate) -> None:
    pod = build_pod(container(limits={"nvidia.com/mig-1g.10gb": 1}), annotations={"team": "search"})
    conversion = translate(pod)
    patched = apply(pod, conversion)
    assert patched["metadata"]["annotations"]["team"] == "search"
    record = json.loads(patched["metadata"]["annotations"][CONVERTED_ANNOTATION])
    assert record["template"] == conversion.template_name
    assert record["containers"] == [
        {
            "container": "main",
            "request": "main",
            "from": {"nvidia.com/mig-1g.10gb": 1},
            "to": ["1 x 1g.10gb"],
        }
    ]


def test_missing_annotations_and_claims_lists_are_created(translate: Translate) -> None:
    pod = build_pod(container(limits={"nvidia.com/gpu": 1}))
    assert "annotations" not in pod["metadata"] and "resourceClaims" not in pod["spec"]
    patched = apply(pod, translate(pod))
    assert CONVERTED_ANNOTATION in patched["metadata"]["annotations"]


def test_a_pod_with_no_metadata_at_all_is_patched(translate: Translate) -> None:
    pod = {"spec": {"containers": [container(limits={"nvidia.com/gpu": 1})]}}
    patched = apply(pod, translate(pod))
    assert CONVERTED_ANNOTATION in patched["metadata"]["annotations"]


def test_a_pod_without_name_or_namespace_takes_the_request_namespace(
    translate: Translate,
) -> None:
    pod = build_pod(container(limits={"nvidia.com/gpu": 1}), name=None)
    conversion = translate(pod, namespace="team-a")
    assert conversion.templates[0]["metadata"]["namespace"] == "team-a"
    assert apply(pod, conversion)["metadata"]["generateName"] == "pod-"


def test_init_containers_and_native_sidecars_are_converted_and_keep_their_fields(
    translate: Translate,
) -> None:
    sidecar = container(
        "proxy",
        limits={"nvidia.com/mig-1g.10gb": 1},
        restartPolicy="Always",
        startupProbe={"exec": {"command": ["true"]}},
    )
    setup = container("setup", requests={"nvidia.com/gpu": 1})
    pod = build_pod(container("app", limits={"nvidia.com/gpu": 1}), init=[setup, sidecar])
    conversion = translate(pod)
    # setup's GPU is the one app uses after it (docs/translation.md: init containers)
    assert [r["name"] for r in requests_of(conversion)] == ["proxy", "app"]
    patched = apply(pod, conversion)
    assert patched["spec"]["initContainers"][0]["resources"] == {
        "claims": [{"name": "gpu-slicer", "request": "app"}]
    }
    proxy = patched["spec"]["initContainers"][1]
    assert proxy["restartPolicy"] == "Always"
    assert proxy["startupProbe"] == {"exec": {"command": ["true"]}}
    assert proxy["resources"] == {"claims": [{"name": "gpu-slicer", "request": "proxy"}]}
    assert [c["name"] for c in patched["spec"]["initContainers"]] == ["setup", "proxy"]


def test_ephemeral_containers_are_never_touched(translate: Translate) -> None:
    debug = {"name": "debug", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    pod = build_pod(container(limits={"nvidia.com/gpu": 1}), ephemeralContainers=[debug])
    conversion = translate(pod)
    assert not any("ephemeralContainers" in op["path"] for op in conversion.patch)
    assert apply(pod, conversion)["spec"]["ephemeralContainers"] == [debug]


def test_fields_the_webhook_does_not_know_survive(translate: Translate) -> None:
    pod = build_pod(container(limits={"nvidia.com/gpu": 1}, futureField={"x": 1}))
    pod["spec"]["futurePodField"] = ["kept"]
    pod["status"] = {"phase": "Pending"}
    patched = apply(pod, translate(pod))
    assert patched["spec"]["futurePodField"] == ["kept"]
    assert patched["spec"]["containers"][0]["futureField"] == {"x": 1}
    assert patched["status"] == {"phase": "Pending"}


def test_only_adds_and_removes_are_used(translate: Translate) -> None:
    pod = build_pod(container(limits={"nvidia.com/gpu": 2}), init=[container("i")])
    assert {op["op"] for op in translate(pod).patch} <= {"add", "remove"}


def test_request_names_are_unique_dns_labels(translate: Translate) -> None:
    pod = build_pod(
        container("gpu-worker", limits={"nvidia.com/gpu": 1}),
        container("GPU_Worker", limits={"nvidia.com/gpu": 1}),
        container("x" * 70, limits={"nvidia.com/gpu": 1}),
    )
    names = [r["name"] for r in requests_of(translate(pod))]
    assert names[:2] == ["gpu-worker", "gpu-worker-2"]
    assert len(names[2]) == 63
    assert len(set(names)) == 3


@pytest.mark.parametrize("length", [253, 254, 100_000])
def test_names_of_any_length_give_the_same_kind_of_label(translate: Translate, length: int) -> None:
    # names up to 253 characters are remembered between pods, longer ones are not
    pod = build_pod(container("_Ab" + "c" * (length - 3), limits={"nvidia.com/gpu": 1}))
    (request,) = requests_of(translate(pod))
    assert request["name"] == "ab" + "c" * 61


# --- idempotency, skipping, content addressing ----------------------------------------------


def test_a_converted_pod_gets_an_empty_patch(translate: Translate) -> None:
    pod = build_pod(
        container(limits={"nvidia.com/gpu": 1}),
        annotations={"gpu-slicer.io/profiles": "1g.10gb"},
    )
    once = apply(pod, translate(pod))
    again = translate(once)
    assert again.patch == [] and again.templates == []
    assert "already converted" in again.summary


def test_a_converted_pod_gets_no_warning(translate: Translate) -> None:
    pod = build_pod(container(limits={"nvidia.com/gpu": 1}))
    assert translate(apply(pod, translate(pod))).warnings == []


def test_a_legacy_request_left_behind_by_a_gpu_slicer_claim_it_did_not_make_is_warned_about(
    translate: Translate,
) -> None:
    # Another tool's claim entry named gpu-slicer, or a container with a GPU request added by a
    # later webhook before reinvocation: nothing is converted, but the admin is told so.
    pod = build_pod(
        container("main", limits={"nvidia.com/gpu": 1}),
        resourceClaims=[{"name": "gpu-slicer", "resourceClaimName": "from-another-tool"}],
    )
    conversion = translate(pod)
    assert conversion.patch == []
    (warning,) = conversion.warnings
    assert "main" in warning and "nvidia.com/gpu" in warning and "gpu-slicer" in warning


def test_the_skip_label_opts_a_pod_out(translate: Translate) -> None:
    pod = build_pod(container(limits={"nvidia.com/gpu": 1}), labels={"gpu-slicer.io/skip": "true"})
    assert translate(pod).patch == []


def test_a_pod_with_nothing_to_convert_gets_an_empty_patch(translate: Translate) -> None:
    conversion = translate(build_pod(container(limits={"cpu": 1})))
    assert conversion == Conversion()


def test_templates_are_content_addressed(translate: Translate) -> None:
    a = translate(build_pod(container(limits={"nvidia.com/gpu": 1}), name="a"), namespace="x")
    b = translate(build_pod(container(limits={"nvidia.com/gpu": 1}), name="b"), namespace="y")
    c = translate(build_pod(container(limits={"nvidia.com/gpu": 2})))
    assert a.template_name == b.template_name
    assert a.template_name != c.template_name
    assert str(a.template_name).startswith("gpu-slicer-")
    labels = a.templates[0]["metadata"]["labels"]
    assert labels == {"app.kubernetes.io/managed-by": "gpu-slicer"}


def test_the_template_name_is_the_hash_of_the_spec_it_carries(translate: Translate) -> None:
    # names are remembered per set of requests: each must still be the hash of its own spec
    pods = [
        build_pod(container(limits={"nvidia.com/gpu": 2})),
        build_pod(container(limits={"nvidia.com/mig-1g.10gb": 1})),
        build_pod(container(), annotations={"gpu-slicer.io/gpu-memory": "19712Mi"}),
        build_pod(container(limits={"nvidia.com/gpu": 2})),
    ]
    for pod in pods:
        (template,) = translate(pod).templates
        assert template["metadata"]["name"] == claims.template_name(template["spec"])


def _scribble(value: Any) -> None:
    """Change every map and list inside ``value`` in place."""
    if isinstance(value, dict):
        for item in value.values():
            _scribble(item)
        value["scribbled"] = True
    elif isinstance(value, list):
        for item in value:
            _scribble(item)
        value.append("scribbled")


def test_a_translation_shares_nothing_mutable_with_later_ones(translate: Translate) -> None:
    pod = build_pod(
        container(limits={"nvidia.com/mig-1g.10gb": 1}),
        container("side", limits={"nvidia.com/gpu": 2}),
    )
    first = translate(pod)
    expected = copy.deepcopy((first.patch, first.templates, first.warnings, first.changes))
    _scribble([first.patch, first.templates, first.warnings])
    first.changes.append(("scribbled", "scribbled"))
    again = translate(pod)
    assert (again.patch, again.templates, again.warnings, again.changes) == expected


@pytest.mark.parametrize(("size", "same"), [("12Gi", "12884901888"), ("19712Mi", "20669530112")])
def test_one_memory_size_written_two_ways_gives_one_template(
    translate: Translate, size: str, same: str
) -> None:
    a = translate(build_pod(container(), annotations={"gpu-slicer.io/gpu-memory": size}))
    b = translate(build_pod(container(), annotations={"gpu-slicer.io/gpu-memory": same}))
    assert a.templates == b.templates


def test_a_memory_size_no_profile_has_is_denied_naming_the_size_as_written(
    translate: Translate,
) -> None:
    for size in ("1Ti", "1099511627776", "1024Gi"):
        pod = build_pod(container(), annotations={"gpu-slicer.io/gpu-memory": size})
        assert f"no MIG profile has {size} of memory" in denied(translate, pod)


def test_translation_does_not_modify_its_input(translate: Translate) -> None:
    pod = build_pod(container(limits={"nvidia.com/gpu": 2}), annotations={"a": "b"})
    before = copy.deepcopy(pod)
    translate(pod)
    assert pod == before


def test_audit_warnings_name_each_conversion_briefly(translate: Translate) -> None:
    pod = build_pod(
        container("a" * 63, limits={"nvidia.com/gpu": 1}),
        container("b", limits={"nvidia.com/mig-1g.10gb": 1}),
    )
    warnings = audit_warnings(translate(pod))
    assert len(warnings) == 2
    assert all(len(w) < 120 for w in warnings)
    assert "nvidia.com/mig-1g.10gb in b" in warnings[1]


def test_the_summary_says_what_was_converted(translate: Translate) -> None:
    conversion = translate(build_pod(container(limits={"nvidia.com/mig-1g.10gb": 1})))
    assert conversion.summary.startswith("converted nvidia.com/mig-1g.10gb in main to gpu-slicer-")


# --- schema validation -----------------------------------------------------------------------

SCENARIOS: dict[str, tuple[Pod, str]] = {
    "one gpu": (build_pod(container(limits={"nvidia.com/gpu": 1})), ""),
    "nvlink chain": (build_pod(container(limits={"nvidia.com/gpu": 8})), ""),
    "mig with fallbacks": (
        build_pod(container(limits={"nvidia.com/mig-1g.10gb": 1})),
        "migFallback: larger",
    ),
    "memory annotation": (
        build_pod(container(), annotations={"gpu-slicer.io/gpu-memory": "19712Mi"}),
        "",
    ),
    "init and sidecar": (
        build_pod(
            container("app", requests={"nvidia.com/gpu": 1}),
            init=[container("proxy", limits={"nvidia.com/mig-2g.20gb": 1}, restartPolicy="Always")],
            resourceClaims=[{"name": "other", "resourceClaimName": "shared"}],
        ),
        "",
    ),
    "right-sized": (
        build_pod(container(limits={"nvidia.com/gpu": 1})),
        "namespaces: {ml: {gpu: [1g.10gb, 2g.20gb, gpu]}}",
    ),
    "nvidia target": (
        build_pod(container(limits={"nvidia.com/gpu": 2, "cpu": 1})),
        "target: nvidia",
    ),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_patched_pods_and_templates_are_valid_for_1_34_to_1_37(scenario: str) -> None:
    pod, policy_text = SCENARIOS[scenario]
    conversion = translate_pod(pod, namespace="ml", policy=load_policy(policy_text))
    patched = apply(pod, conversion)
    validate(patched)
    (template,) = conversion.templates
    validate(template)


def test_the_schema_check_refuses_what_the_api_would_refuse() -> None:
    pod = build_pod(container(limits={"nvidia.com/gpu": 2}))
    (template,) = translate_pod(pod, namespace="ml", policy=Policy.default()).templates
    validate(template)
    broken = copy.deepcopy(template)
    broken["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0]["count"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken)
    broken = copy.deepcopy(template)
    broken["spec"]["spec"]["devices"]["unknownField"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken)


# --- robustness ------------------------------------------------------------------------------

_names = st.sampled_from(["main", "side", "init", "a", "b", "x" * 63, "Weird_Name", ""])
_resource_names = st.sampled_from(
    [
        "nvidia.com/gpu",
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-9g.1tb",
        "nvidia.com/mig-",
        "cpu",
        "memory",
        "nvidia.com/gpu.shared",
        "example.com/x~y",
    ]
)
_good_values = st.sampled_from(["1", "2", 1, 4])
_values = st.one_of(
    _good_values,
    _good_values,
    st.sampled_from(["0", "8", "1.5", "100m", "-1", "x", "1e1", "1Ki"]),
    st.integers(-2, 10),
    st.none(),
    st.booleans(),
)
_legacy_map = st.builds(
    lambda name, value: {name: value, "cpu": "1"},
    st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"]),
    _good_values,
)
_resource_map = st.one_of(_legacy_map, st.dictionaries(_resource_names, _values, max_size=3))
_resources = st.one_of(
    st.fixed_dictionaries({"limits": _legacy_map}),
    st.fixed_dictionaries({"limits": _resource_map}),
    st.fixed_dictionaries({"requests": _resource_map}),
    st.fixed_dictionaries({}, optional={"limits": _resource_map, "requests": _resource_map}),
    st.none(),
    st.just("garbage"),
)
_container = st.fixed_dictionaries(
    {"name": _names, "resources": _resources},
    optional={"restartPolicy": st.just("Always"), "image": st.just("i")},
)
_annotation_values = st.one_of(
    st.sampled_from(
        [
            "1g.10gb",
            "1g.10gb,2g.20gb",
            "gpu",
            "9g.1tb",
            "",
            ",",
            "12Gi",
            "1Ti",
            "main",
            "main,side",
            "nope",
            'a"b\\c',
        ]
    ),
    st.text(max_size=12),
)
_annotations = st.dictionaries(
    st.sampled_from(
        ["gpu-slicer.io/profiles", "gpu-slicer.io/gpu-memory", "gpu-slicer.io/containers", "x/y"]
    ),
    _annotation_values,
    max_size=3,
)
_pods = st.fixed_dictionaries(
    {
        "metadata": st.one_of(
            st.fixed_dictionaries({}, optional={"annotations": _annotations, "name": _names}),
            st.fixed_dictionaries({"name": _names}),
            st.none(),
        ),
        "spec": st.fixed_dictionaries(
            {"containers": st.lists(_container, min_size=1, max_size=3)},
            optional={
                "initContainers": st.lists(_container, max_size=2),
                "ephemeralContainers": st.lists(_container, max_size=1),
                "resourceClaims": st.lists(
                    st.fixed_dictionaries({"name": st.sampled_from(["x", "gpu-slicer"])}),
                    max_size=1,
                ),
            },
        ),
    }
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pod=_pods,
    policy_text=st.sampled_from(
        ["", "migFallback: larger", "target: nvidia", "namespaces: {ml: {gpu: [1g.10gb, gpu]}}"]
    ),
)
def test_random_pods_are_converted_or_denied_and_never_crash(pod: Pod, policy_text: str) -> None:
    try:
        conversion = translate_pod(pod, namespace="ml", policy=load_policy(policy_text))
    except Denied as exc:
        assert exc.message
        return
    if not conversion.patch:
        return
    patched = jsonpatch.apply_patch(pod, conversion.patch)
    again = translate_pod(patched, namespace="ml", policy=load_policy(policy_text))
    assert again.patch == []
    assert all(len(w) < 120 for w in audit_warnings(conversion))
    for template in conversion.templates:
        assert template["metadata"]["name"] == claims.template_name(template["spec"])
        validate(template)


@pytest.mark.parametrize(
    "pod",
    [
        build_pod(container(limits={"nvidia.com/gpu": "100000"})),
        build_pod(*(container(f"c{i}", limits={"nvidia.com/mig-1g.10gb": 8}) for i in range(5))),
    ],
    ids=["one huge count", "counts that add up past the limit"],
)
def test_a_pod_needing_more_devices_than_a_claim_can_hold_is_denied(
    translate: Translate, pod: Pod
) -> None:
    # Kubernetes allocates at most 32 devices to one claim; a bigger claim would leave the pod
    # pending forever with a scheduler error instead of a message at admission.
    with pytest.raises(Denied) as info:
        translate(pod)
    assert "at most 32 devices" in info.value.message


def test_a_pod_needing_exactly_32_devices_is_converted(translate: Translate) -> None:
    pod = build_pod(*(container(f"c{i}", limits={"nvidia.com/mig-1g.10gb": 8}) for i in range(4)))
    assert translate(pod).templates


def test_a_media_extension_slice_as_the_device_plugin_names_it_is_converted(
    translate: Translate,
) -> None:
    # The NVIDIA device plugin turns a profile's "+" into "." ("+" is not allowed in a resource
    # name), so pods ask for nvidia.com/mig-1g.10gb.me to get a 1g.10gb+me slice.
    pod = build_pod(container(limits={"nvidia.com/mig-1g.10gb.me": 1}))
    conversion = translate(pod)
    (request,) = conversion.requests
    assert [alt.profile for alt in request.alternatives] == ["1g.10gb+me"]
    assert "nvidia.com/mig-1g.10gb.me" not in json.dumps(apply(pod, conversion)["spec"])
    assert conversion.changes == [("main", "nvidia.com/mig-1g.10gb.me")]
