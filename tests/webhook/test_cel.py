"""Generated CEL selectors, evaluated with cel-python against the devices the node agent advertises.

The devices come from the agent's own inventory code (``slicer.inventory.build_slices``, what
``gpu-slicer slices`` prints) for a simulated node with one GPU of every catalog model, so the
attribute names the webhook selects on are checked against the ones the agent publishes.

Selectors are evaluated through ``kube.device_cel``, the project's one model of the scheduler's
CEL environment (the simulator's allocator uses it too). cel-python is slow; ``kube.device_cel``
compiles each expression once and, for the literal ``device.attributes["dom"].id`` form every
generated selector has, evaluates it once per driver and *referenced* values: the slices of one
profile share a verdict, and an expression that reads the placement gets one per placement.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from celpy import celtypes
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_slicer.core import catalog
from gpu_slicer.core.identity import DRIVER
from gpu_slicer.kube.device_cel import DeviceView, matches, program
from gpu_slicer.kube.quantity import parse_bytes
from gpu_slicer.slicer.inventory import GpuState, build_slices, default_mode
from gpu_slicer.slicer.simulated import SimulatedBackend
from gpu_slicer.webhook import cel
from gpu_slicer.webhook.policy import Policy, load_policy
from gpu_slicer.webhook.targets import GPU_SLICER, NVIDIA, TargetDriver
from gpu_slicer.webhook.translate import translate_pod
from tests.support.agent_fixtures import bare_names
from tests.support.webhook_cases import build_pod, container

Device = DeviceView
"""A device as the simulator's model of the scheduler's CEL environment presents it
(``kube.device_cel``: one compiled program per expression, one verdict per driver and referenced
values)."""


def name_of(device: Device) -> str:
    return str(device.raw["name"])


@pytest.fixture(scope="module")
def advertised() -> list[dict[str, Any]]:
    """Every device of a node with one GPU of each catalog model."""
    backend = SimulatedBackend([m.key for m in catalog.MODELS])
    gpus = [GpuState(info=i, mode=default_mode(catalog.get_model(i.model))) for i in backend.gpus()]
    slices = build_slices("node-a", gpus)
    return [d for s in slices for d in s["spec"].get("devices", [])]


@pytest.fixture(scope="module")
def devices(advertised: list[dict[str, Any]]) -> dict[str, list[Device]]:
    """The advertised devices in CEL form, as gpu-slicer's and as if NVIDIA's driver had them
    (its attributes bare, in its own domain)."""
    bare = bare_names(advertised)
    return {
        GPU_SLICER.name: [DeviceView(DRIVER, d) for d in advertised],
        NVIDIA.name: [DeviceView(NVIDIA.domain, d) for d in bare],
    }


def in_class(device: Device, class_name: str, target: TargetDriver) -> bool:
    """The DeviceClasses (docs/architecture.md): driver plus ``type``."""
    kind = "gpu" if class_name == target.gpu_class else "mig"
    attrs = device.attributes.get(target.domain, {})
    driver = DRIVER if target is GPU_SLICER else target.domain
    return bool(device.driver == driver and attrs.get("type") == kind)


def chosen(subrequest: dict[str, Any], devices: list[Device], target: TargetDriver) -> set[str]:
    """Names of the devices a request (``exactly``) or subrequest may use."""
    expressions = [s["cel"]["expression"] for s in subrequest.get("selectors", [])]
    return {
        name_of(d)
        for d in devices
        if in_class(d, subrequest["deviceClassName"], target)
        and all(matches(e, d) for e in expressions)
    }


def alternatives(template: dict[str, Any]) -> list[dict[str, Any]]:
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    return request["firstAvailable"] if "firstAvailable" in request else [request["exactly"]]


def profile_of(device: Device, target: TargetDriver) -> str | None:
    value = device.attributes.get(target.domain, {}).get("profile")
    return None if value is None else str(value)


def profiles(names: set[str], devices: list[Device], target: TargetDriver) -> set[str | None]:
    return {profile_of(d, target) for d in devices if name_of(d) in names}


def memory_of(device: Device, target: TargetDriver) -> int | Fraction:
    return device.capacity[target.domain]["memory"]


def big_enough(devices: list[Device], wanted: int) -> set[str]:
    """The MIG devices (not ``+me`` variants) with at least ``wanted`` bytes of memory."""
    return {
        name_of(d)
        for d in devices
        if profile_of(d, GPU_SLICER) is not None
        and not str(profile_of(d, GPU_SLICER)).endswith("+me")
        and memory_of(d, GPU_SLICER) >= wanted
    }


def converted_template(pod: dict[str, Any], policy: Policy, namespace: str = "ml") -> Any:
    conversion = translate_pod(pod, namespace=namespace, policy=policy)
    (template,) = conversion.templates
    return template


# --- string literals -------------------------------------------------------------------------

NASTY = [
    "",
    'x" || true || "',
    "back\\slash",
    '\\"',
    "new\nline\r\t",
    "\x00\x07\x1b",
    "ünïcödé ✓ 𝔘",
    "' single '",
    "${injection}",
]


@pytest.mark.parametrize("text", NASTY, ids=repr)
def test_a_quoted_string_evaluates_to_itself(text: str) -> None:
    runner = program(f"{cel.quote(text)} == s").runner
    assert runner.evaluate({"s": celtypes.StringType(text)}) == celtypes.BoolType(True)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=40))
def test_any_string_survives_quoting(text: str) -> None:
    assert str(program(cel.quote(text)).runner.evaluate({})) == text


def test_a_profile_name_cannot_break_out_of_its_literal(
    devices: dict[str, list[Device]],
) -> None:
    expression = cel.profile_selector(GPU_SLICER, 'x" || true || "')
    assert not any(matches(expression, d) for d in devices["gpu-slicer"])


# --- selectors against advertised devices ----------------------------------------------------


@pytest.mark.parametrize("profile", catalog.all_profile_names())
def test_a_mig_request_selects_exactly_the_devices_of_its_profile(
    profile: str, devices: dict[str, list[Device]], policy: Policy
) -> None:
    pod = build_pod(container(limits={f"nvidia.com/mig-{profile}": 1}))
    (exact,) = alternatives(converted_template(pod, policy))
    ours = devices["gpu-slicer"]
    expected = {name_of(d) for d in ours if profile_of(d, GPU_SLICER) == profile}
    assert expected, f"the simulated node advertises no {profile}"
    assert chosen(exact, ours, GPU_SLICER) == expected


def test_a_whole_gpu_request_selects_only_whole_gpus(
    devices: dict[str, list[Device]], policy: Policy
) -> None:
    pod = build_pod(container(limits={"nvidia.com/gpu": 1}))
    whole, full = alternatives(converted_template(pod, policy))
    ours = devices["gpu-slicer"]
    found = chosen(whole, ours, GPU_SLICER)
    assert found
    assert all(profile_of(d, GPU_SLICER) is None for d in ours if name_of(d) in found)
    # then, on GPUs in MIG mode (no whole-GPU device), the instance that spans the GPU
    migs = [d.attributes[GPU_SLICER.domain] for d in ours if profile_of(d, GPU_SLICER)]
    widest: dict[str, int] = {}
    for attrs in migs:
        parent = str(attrs["parentUUID"])
        widest[parent] = max(widest.get(parent, 0), int(attrs["placementSize"]))
    spanning = {
        name_of(d)
        for d in ours
        if profile_of(d, GPU_SLICER) is not None
        and not str(profile_of(d, GPU_SLICER)).endswith("+me")
        and d.attributes[GPU_SLICER.domain]["placementSize"]
        == widest[str(d.attributes[GPU_SLICER.domain]["parentUUID"])]
    }
    assert chosen(full, ours, GPU_SLICER) == spanning
    assert profiles(spanning, ours, GPU_SLICER) >= {"7g.80gb", "7g.40gb", "4g.24gb"}


# 9800Mi, 19712Mi and 39000Mi fall between the memory of one profile name on two models
# (1g.10gb, 2g.20gb, 3g.40gb), so their chains select by capacity too.
def _memory_chain(
    size: str, devices: dict[str, list[Device]], policy: Policy
) -> tuple[list[dict[str, Any]], list[Device], int]:
    """The chain a ``gpu-memory: size`` pod gets, gpu-slicer's devices and the bytes asked."""
    pod = build_pod(container(), annotations={"gpu-slicer.io/gpu-memory": size})
    return alternatives(converted_template(pod, policy)), devices["gpu-slicer"], parse_bytes(size)


@pytest.mark.parametrize(
    "size",
    [
        "4Gi",
        "9800Mi",
        "10Gi",
        "12Gi",
        "19712Mi",
        "20Gi",
        "39000Mi",
        "40Gi",
        "70Gi",
        "100Gi",
        "150Gi",
    ],
)
def test_a_memory_chain_selects_only_devices_with_enough_memory_smallest_first(
    size: str, devices: dict[str, list[Device]], policy: Policy
) -> None:
    chain, ours, wanted = _memory_chain(size, devices, policy)
    memory = {name_of(d): memory_of(d, GPU_SLICER) for d in ours}
    fitting = big_enough(ours, wanted)
    picked = [chosen(subrequest, ours, GPU_SLICER) for subrequest in chain]
    assert all(picked), "every alternative selects some device"
    assert all(memory[name] >= wanted for names in picked for name in names)
    smallest = [min(memory[name] for name in names) for names in picked]
    assert smallest == sorted(smallest)
    if len(chain) < 8:
        assert set().union(*picked) == fitting


@pytest.mark.parametrize("size", ["10Gi", "15Gi", "20Gi", "40G", "40Gi", "70Gi", "80Gi"])
def test_a_memory_chain_on_the_whole_catalog_reaches_every_gpu_big_enough(
    size: str, devices: dict[str, list[Device]], policy: Policy
) -> None:
    # The default policy's chain spans every catalog model: more profile names fit than a chain
    # has entries, so each entry is a tier of every model's k-th fitting profile (an H200 asked
    # for 40G, a B300). Every GPU with an instance big enough must be reachable.
    chain, ours, wanted = _memory_chain(size, devices, policy)

    def gpu_of(name: str) -> str:
        return "-".join(name.split("-")[:2])

    gpus = {gpu_of(name) for name in big_enough(ours, wanted)}
    reached = {gpu_of(n) for sub in chain for n in chosen(sub, ours, GPU_SLICER)}
    assert len(chain) <= 8
    assert reached == gpus


@pytest.mark.parametrize("size", ["4Gi", "9800Mi", "12Gi", "19712Mi", "20Gi", "40G", "70Gi"])
def test_on_each_gpu_model_a_memory_chain_offers_its_fitting_profiles_smallest_first(
    size: str, devices: dict[str, list[Device]], policy: Policy
) -> None:
    # The chain is in tiers (one alternative stands for every model's k-th smallest fitting
    # profile), so on a node of one model the scheduler sees exactly the chain that names that
    # model's profiles one by one: each alternative selects one profile of the GPU, in order.
    chain, ours, wanted = _memory_chain(size, devices, policy)
    by_gpu: dict[str, list[Device]] = {}
    for device in ours:
        parent = device.attributes[GPU_SLICER.domain].get("parentUUID")
        if parent is not None:
            by_gpu.setdefault(str(parent), []).append(device)
    checked = 0
    for gpu_devices in by_gpu.values():
        fitting = big_enough(gpu_devices, wanted)
        size = {
            profile_of(d, GPU_SLICER): (
                memory_of(d, GPU_SLICER),
                d.capacity[GPU_SLICER.domain]["multiprocessors"],
            )
            for d in gpu_devices
        }
        expected = sorted(profiles(fitting, gpu_devices, GPU_SLICER), key=size.__getitem__)
        offered = [
            profiles(chosen(sub, gpu_devices, GPU_SLICER), gpu_devices, GPU_SLICER) for sub in chain
        ]
        assert all(len(found) <= 1 for found in offered), offered
        assert [p for found in offered for p in found] == expected[: len(chain)]
        checked += bool(expected)
    assert checked >= 5


def test_right_sized_gpus_select_the_namespace_profiles_in_order(
    devices: dict[str, list[Device]], embeddings_policy: Policy
) -> None:
    pod = build_pod(container(limits={"nvidia.com/gpu": 1}))
    chain = alternatives(converted_template(pod, embeddings_policy, namespace="embeddings"))
    ours = devices["gpu-slicer"]
    picked = [profiles(chosen(s, ours, GPU_SLICER), ours, GPU_SLICER) for s in chain]
    assert picked == [{"1g.10gb"}, {"2g.20gb"}, {"3g.40gb"}]


def test_the_nvidia_target_selects_on_nvidia_attributes(devices: dict[str, list[Device]]) -> None:
    policy = load_policy("target: nvidia\nmigFallback: {explicit: {1g.10gb: [2g.20gb]}}")
    pod = build_pod(container(limits={"nvidia.com/mig-1g.10gb": 1}))
    chain = alternatives(converted_template(pod, policy))
    assert [s["deviceClassName"] for s in chain] == ["mig.nvidia.com", "mig.nvidia.com"]
    theirs = devices["nvidia"]
    picked = [profiles(chosen(s, theirs, NVIDIA), theirs, NVIDIA) for s in chain]
    assert picked == [{"1g.10gb"}, {"2g.20gb"}]
    # gpu-slicer's own devices are not NVIDIA's: nothing of them is chosen
    assert not any(chosen(s, devices["gpu-slicer"], NVIDIA) for s in chain)
