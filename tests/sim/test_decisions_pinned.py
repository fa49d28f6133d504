"""Every placement decision of a mid-sized scenario, pinned: a change meant only to make the
simulator faster must not move a single pod.

``pinned/<policy>.txt`` holds, per placement in order, one line: the pod, its node, the GPU slots
it holds (gpu/profile/start) and when it started; a failure names the placements that moved,
where they were and where they are now. A change of the inputs (the catalog, the webhook's
translation, the agent's inventory or a policy) may move pods on purpose: then check the new
figures, rewrite the files with ``GPU_SLICER_UPDATE_PINS=1`` set, and commit them with the
change, saying why they moved.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gpu_slicer.sim.compare import make_strategy
from gpu_slicer.sim.demand import DemandBook
from gpu_slicer.sim.event_loop import Engine, Held, PodRecord
from gpu_slicer.sim.scenario import Scenario, parse_scenario

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

PINS: dict[str, tuple[int, int, int]] = {
    # policy: (served, MIG instances created, destroyed)
    "name": (768, 742, 718),
    "anti-fragmentation": (770, 750, 724),
    "best-fit": (770, 750, 724),
}
PINNED = Path(__file__).parent / "pinned"
SHOWN = 10
"""Moved placements a failure lists."""


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
    placements = [_line(*placement) for placement in engine.log]
    pinned_file = PINNED / f"{policy}.txt"
    if os.environ.get("GPU_SLICER_UPDATE_PINS") == "1":
        pinned_file.write_text("\n".join(placements) + "\n")
    assert _moved(pinned_file.read_text().splitlines(), placements) == []
    assert (result.served, result.creations, result.destructions) == PINS[policy]


def _line(pod: str, node: str, slots: list[tuple[int, str | None, int]], started: float) -> str:
    held = ",".join(f"{gpu}/{profile or 'gpu'}/{start}" for gpu, profile, start in slots)
    return f"{pod} {node} {held} {started!r}"


def _moved(pinned: list[str], placements: list[str]) -> list[str]:
    """The first placements that differ from the pinned ones: where each was and is now."""
    moved = [
        f"placement {index}: was {was or '(none)'!r}, now {now or '(none)'!r}"
        for index, (was, now) in enumerate(
            zip(pinned + [""] * len(placements), placements + [""] * len(pinned), strict=False)
        )
        if was != now
    ]
    return moved[:SHOWN] + ([f"... {len(moved) - SHOWN} more"] if len(moved) > SHOWN else [])
