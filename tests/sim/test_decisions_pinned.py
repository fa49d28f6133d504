"""Every placement decision of a mid-sized scenario, pinned: a change meant only to make the
simulator faster must not move a single pod.

The digest covers, per placement in order: the pod, its node, the GPU slots it holds and when it
started. A change of the inputs (the catalog, the webhook's translation, the agent's inventory or
a policy) may move pods on purpose: then check the new figures, and update the pins in the same
commit, saying why they moved.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from sim.compare import make_strategy
from sim.demand import DemandBook
from sim.event_loop import Engine, Held, PodRecord
from sim.scenario import Scenario, parse_scenario

PINNED_SCENARIO: dict[str, Any] = {
    "name": "pinned",
    "end": "16h",
    "sample": "10m",
    "seed": 5,
    "kubernetes": "1.36",
    "scheduler": {"nodeRule": "pack"},
    "agent": {"republishMinInterval": "10s", "republishQuiet": "2s"},
    "nodes": [
        {"namePrefix": "h100-", "count": 3, "gpus": "H100-80GB:4"},
        {"namePrefix": "a100-", "count": 3, "gpus": "A100-80GB:4"},
    ],
    "namespaces": {"inference": "enabled", "research": "enabled", "training": "enabled"},
    "policy": {
        "gpuModels": ["H100-80GB", "A100-80GB"],
        "namespaces": {"inference": {"gpu": ["1g.10gb", "2g.20gb", "3g.40gb"]}},
    },
    "generators": [
        {
            "name": "inference",
            "count": 500,
            "from": 0,
            "to": "12h",
            "namespace": "inference",
            "duration": {"distribution": "lognormal", "mean": "50m", "min": "2m", "max": "6h"},
            "mix": [{"resources": {"nvidia.com/gpu": 1}}],
        },
        {
            "name": "notebooks",
            "count": 120,
            "from": "1h",
            "to": "11h",
            "namespace": "research",
            "duration": {"distribution": "lognormal", "mean": "2h", "min": "10m", "max": "8h"},
            "mix": [
                {"weight": 3, "resources": {"nvidia.com/mig-2g.20gb": 1}},
                {"weight": 1, "resources": {"nvidia.com/mig-1g.20gb": 1}},
            ],
        },
        {
            "name": "finetune",
            "count": 120,
            "from": "1h",
            "to": "12h",
            "namespace": "training",
            "duration": {"distribution": "lognormal", "mean": "3h", "min": "30m", "max": "10h"},
            "mix": [
                {"weight": 3, "resources": {"nvidia.com/mig-3g.40gb": 1}},
                {"weight": 1, "resources": {"nvidia.com/mig-4g.40gb": 1}},
            ],
        },
        {
            "name": "training",
            "count": 50,
            "from": 0,
            "to": "12h",
            "namespace": "training",
            "duration": {"distribution": "uniform", "min": "1h", "max": "4h"},
            "mix": [{"resources": {"nvidia.com/gpu": 1}}],
        },
    ],
}

PINS: dict[str, tuple[int, int, int, str]] = {
    # policy: (served, MIG instances created, destroyed, digest of the placements)
    "name": (768, 742, 718, "e09a612de04b1df0"),
    "anti-fragmentation": (770, 750, 724, "7bdea4c72fc96a5a"),
    "best-fit": (770, 750, 724, "1446c0cc525bf9ff"),
}


class RecordingEngine(Engine):
    """The engine, noting every placement as it is made."""

    log: list[tuple[str, str, list[tuple[int, str | None, int]], float]]

    def _hold(self, record: PodRecord, held: Held) -> None:
        if not hasattr(self, "log"):
            self.log = []
        self.log.append(
            (
                record.pod.name,
                held.node,
                [(s.gpu, s.profile, s.start) for s in held.slots],
                self.last_t,
            )
        )
        super()._hold(record, held)


@pytest.fixture(scope="module")
def pinned() -> Scenario:
    return parse_scenario(PINNED_SCENARIO)


@pytest.mark.parametrize("policy", sorted(PINS))
def test_the_fast_path_places_every_pod_where_it_always_did(pinned: Scenario, policy: str) -> None:
    strategy = make_strategy(f"gpu-slicer-{policy}", pinned, DemandBook(pinned), through_api=False)
    try:
        engine = RecordingEngine(pinned, strategy)
        result = engine.run()
        assert engine.drain() == []
    finally:
        strategy.close()
    digest = hashlib.sha256(json.dumps(engine.log).encode()).hexdigest()[:16]
    assert (result.served, result.creations, result.destructions, digest) == PINS[policy]
