"""The fast path's per-GPU caches (order, ruled_out) publish exactly what the agent's
plan_pool publishes, and what a republish carries into the next pool generation is what it
would have built."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from gpu_slicer.core import catalog, gpu_model
from gpu_slicer.core.devices import DeviceSpec, SliceSpec, WholeGpu
from gpu_slicer.sim.compare import compare
from gpu_slicer.sim.fast_node import (
    LISTED_AGAIN,
    MORE_LEFT_OUT,
    SAME,
    GpuKey,
    NodeKind,
    devices_changed,
)
from gpu_slicer.sim.pools import CandidateList, Pool, compile_pools
from gpu_slicer.sim.scenario import load_scenario
from gpu_slicer.slicer.inventory import GpuState, plan_pool
from gpu_slicer.slicer.ordering import DEVICE_ORDERS, get_device_order
from gpu_slicer.slicer.simulated import SimulatedBackend


def _random_allocation(rng: random.Random, models: list[gpu_model.GpuModel]) -> list[DeviceSpec]:
    allocated: list[DeviceSpec] = []
    for index, model in enumerate(models):
        roll = rng.random()
        if roll < 0.2:
            continue
        if roll < 0.3:
            allocated.append(WholeGpu(index))
            continue
        present: list[catalog.Placement] = []
        for _ in range(rng.randint(1, 4)):
            options = catalog.remaining_placements(model, present)
            options = [o for o in options if not model.profile(o[0]).media_exclusive]
            if not options:
                break
            choice = rng.choice(options)
            present.append(choice)
            allocated.append(SliceSpec(index, choice[0], choice[1]))
    return allocated


VERSION = (1, 37)


def _key(gpu: int, specs: Sequence[DeviceSpec]) -> GpuKey:
    """What is in use on ``gpu`` with ``specs`` (of that GPU) allocated, worked out here from
    scratch."""
    placements = sorted((s.profile, s.start) for s in specs if isinstance(s, SliceSpec))
    return (gpu, tuple(placements), any(isinstance(s, WholeGpu) for s in specs))


@pytest.mark.parametrize("policy", sorted(DEVICE_ORDERS))
@pytest.mark.parametrize("spec", ["H100-80GB:8", "A100-80GB:2,H100-80GB:2"])
def test_cached_order_equals_the_published_order(policy: str, spec: str) -> None:
    """A node's GPUs stepped to the states of random allocations (``GpuUse.after``) list, in the
    node's order, exactly what ``plan_pool`` publishes for those allocations."""
    backend = SimulatedBackend(spec, node_name="n")
    states = [GpuState(info=g, mode="dynamic") for g in backend.gpus()]
    models = [catalog.get_model(g.model) for g in backend.gpus()]
    kind = NodeKind()
    kind.compile("n", states, device_order=get_device_order(policy), server_version=VERSION)
    rng = random.Random(f"{policy}/{spec}")
    for _ in range(12):
        allocated = _random_allocation(rng, models)
        published = plan_pool(
            "n", states, device_order=policy, allocated=allocated, server_version=VERSION
        )
        uses = [kind.use((i, (), False)) for i in range(len(models))]
        for device in allocated:
            uses[device.gpu_index] = uses[device.gpu_index].after(device, True)
        assert [u.key for u in uses] == [
            _key(i, [a for a in allocated if a.gpu_index == i]) for i in range(len(models))
        ]
        left_out = frozenset().union(*(u.ruled_out for u in uses))
        assert left_out == published.ruled_out
        order = [name for i in kind.node_order(uses) for name in uses[i].order]
        assert [n for n in order if n not in left_out] == list(published.order)
        # ... and the allocator walks the published slices in that same order.
        pool = compile_pools(published.slices)[0]
        assert [d.name for d in pool.devices] == list(published.order)


def _fresh(pool: Pool, expressions: tuple[str, ...]) -> tuple[list[str], dict[int, int]]:
    """The candidate list of ``expressions`` built from scratch on ``pool``."""
    members = pool.members[expressions]
    built = CandidateList.of([d for d in pool.devices if d.name in members])
    return [d.name for d in built.devices], built.bounds


@pytest.mark.parametrize("policy", ["name", "best-fit"])
def test_every_candidate_list_a_republish_carries_is_the_list_built_fresh(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A republish that only adds or takes out devices keeps the candidate lists of the
    selectors no changed device passes: on a day of the mixed scenario, each kept list holds
    the devices (and segments) the allocator would have found by filtering the new pool."""
    reordered = Pool.reordered
    checked = {"carried": 0, "republishes": 0}

    def watched(self: Pool, names: Sequence[str], changed: frozenset[str] | None = None) -> Pool:
        pool = reordered(self, names, changed)
        checked["republishes"] += 1
        for expressions, kept in pool.candidates.items():
            assert ([d.name for d in kept.devices], kept.bounds) == _fresh(pool, expressions)
            checked["carried"] += 1
        return pool

    monkeypatch.setattr(Pool, "reordered", watched)
    scenario = load_scenario("mixed-day")
    compare(scenario, [f"gpu-slicer-{policy}"], through_api=False)
    assert checked["republishes"] > 100
    assert checked["carried"] > 100


def test_devices_changed_names_the_devices_added_or_taken_out_and_refuses_a_move() -> None:
    same = ["gpu-1", "gpu-1-mig-1g10gb-0"]
    before = [["gpu-0", "gpu-0-mig-1g10gb-0", "gpu-0-mig-1g10gb-1"], same]
    after = [["gpu-0-mig-1g10gb-1", "gpu-0-mig-2g20gb-2"], same]
    assert devices_changed(before, after) == frozenset(
        {"gpu-0", "gpu-0-mig-1g10gb-0", "gpu-0-mig-2g20gb-2"}
    )
    moved = [["gpu-0-mig-1g10gb-1", "gpu-0-mig-1g10gb-0"], same]
    assert devices_changed(before, moved) is None
    assert devices_changed(before, [same]) is None


def test_a_gpu_state_after_each_allocation_and_release_is_the_state_of_what_is_allocated() -> None:
    """``GpuUse.after`` steps from state to state; each step lands on the one interned state
    that the devices then allocated on the GPU make (worked out from scratch)."""
    model = catalog.get_model("A100-80GB")
    kind = NodeKind()
    rng = random.Random(5)
    use = kind.use((0, (), False))
    held: list[DeviceSpec] = []
    for _ in range(300):
        if held and rng.random() < 0.45:
            spec = held.pop(rng.randrange(len(held)))
            use = use.after(spec, False)
        else:
            present = [(s.profile, s.start) for s in held if isinstance(s, SliceSpec)]
            options = catalog.remaining_placements(model, present)
            whole = not held and rng.random() < 0.1
            if not options and not whole:
                continue
            if whole:
                added: DeviceSpec = WholeGpu(0)
            else:
                profile, start = rng.choice(options)
                added = SliceSpec(0, profile, start)
            held.append(added)
            use = use.after(added, True)
        assert use is kind.use(_key(0, held))


def test_two_gpu_states_compare_as_what_each_leaves_out() -> None:
    """``GpuUse.compared`` (kept per pair of states) says whether a republish only leaves more
    out, which the agent may hold back, or lists a device again, which it publishes at once:
    for random pairs of states and choices of profiles, what the sets they leave out say."""
    backend = SimulatedBackend("A100-80GB:1", node_name="n")
    states = [GpuState(info=g, mode="mig") for g in backend.gpus()]
    models = [catalog.get_model("A100-80GB")]
    kind = NodeKind()
    order = get_device_order("name")
    kind.compile("n", states, device_order=order, server_version=VERSION)
    rng = random.Random(11)
    uses = [kind.use(_key(0, _random_allocation(rng, models))) for _ in range(40)]
    choices = {
        "all": frozenset(),
        "3g only": frozenset(uses[0].order) - {n for n in uses[0].order if "3g40gb" in n},
    }
    seen = {SAME: 0, MORE_LEFT_OUT: 0, LISTED_AGAIN: 0}
    for choice, hidden in choices.items():
        for was in uses:
            for now in uses:
                mine, theirs = was.left_out(choice, hidden), now.left_out(choice, hidden)
                expected = (
                    SAME if mine == theirs else MORE_LEFT_OUT if mine < theirs else LISTED_AGAIN
                )
                assert was.compared(now, choice, hidden) == expected
                assert was.compared(now, choice, hidden) == expected  # kept, the same
                seen[expected] += 1
    assert all(seen.values())  # every answer came up
