"""The fast path's per-GPU caches (order, ruled_out) publish exactly what the agent's
plan_pool publishes."""

from __future__ import annotations

import random

import pytest

from gpu_slicer.core import catalog, gpu_model
from gpu_slicer.core.devices import DeviceSpec, SliceSpec, WholeGpu, parse_device_name
from gpu_slicer.sim.fast_node import GpuOrderCache, RuledOut, gpu_key
from gpu_slicer.sim.pools import compile_pools
from gpu_slicer.slicer.inventory import GpuState, plan_pool
from gpu_slicer.slicer.ordering import DEVICE_ORDERS, Occupancy, get_device_order
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


@pytest.mark.parametrize("policy", sorted(DEVICE_ORDERS))
@pytest.mark.parametrize("spec", ["H100-80GB:8", "A100-80GB:2,H100-80GB:2"])
def test_cached_order_equals_the_published_order(policy: str, spec: str) -> None:
    backend = SimulatedBackend(spec, node_name="n")
    states = [GpuState(info=g, mode="dynamic") for g in backend.gpus()]
    models = [catalog.get_model(g.model) for g in backend.gpus()]
    empty = plan_pool("n", states, device_order=policy)
    models_by_gpu = dict(enumerate(models))
    from gpu_slicer.slicer.ordering import Candidate

    candidates = []
    for name in empty.order:
        parsed = parse_device_name(name)
        model = models_by_gpu[parsed.gpu_index]
        profile = model.profile(parsed.profile) if isinstance(parsed, SliceSpec) else None
        candidates.append(Candidate(parsed, model, profile))
    cache = GpuOrderCache(get_device_order(policy), candidates)
    ruled_out = RuledOut(states)
    rng = random.Random(f"{policy}/{spec}")
    for _ in range(12):
        allocated = _random_allocation(rng, models)
        published = plan_pool("n", states, device_order=policy, allocated=allocated)
        keys = [gpu_key(i, [a for a in allocated if a.gpu_index == i]) for i in range(len(models))]
        left_out = ruled_out.union(keys)
        assert left_out == published.ruled_out
        order = cache.order(Occupancy.of({}, allocated))
        assert [n for n in order if n not in left_out] == list(published.order)
        # ... and the allocator walks the published slices in that same order.
        pool = compile_pools(published.slices)[0]
        assert [d.name for d in pool.devices] == list(published.order)
