"""Run strategies on one scenario's trace and collect their figures.

Strategy names: ``device-plugin``, ``static-<layout>`` (``static-balanced``, ``static-1g``, and
every layout the scenario defines), ``instaslice``, ``gpu-slicer-<policy>`` for every device-order
policy of the agent (``name``, ``anti-fragmentation``, ``best-fit``), and ``oracle``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpu_slicer.sim.baselines import baseline
from gpu_slicer.sim.demand import DemandBook
from gpu_slicer.sim.errors import UnknownNameError
from gpu_slicer.sim.event_loop import Engine, Result, Strategy
from gpu_slicer.sim.scenario import Scenario
from gpu_slicer.slicer.ordering import DEVICE_ORDERS

DEFAULT_STRATEGIES: tuple[str, ...] = (
    "device-plugin",
    "static-balanced",
    "static-1g",
    "instaslice",
    "gpu-slicer-name",
    "gpu-slicer-anti-fragmentation",
    "gpu-slicer-best-fit",
    "oracle",
)


def strategy_names(scenario: Scenario) -> list[str]:
    """Every strategy that can run on ``scenario``, in report order."""
    names = ["device-plugin"]
    names += [f"static-{layout}" for layout in scenario.layouts]
    names += ["instaslice"]
    names += [f"gpu-slicer-{policy}" for policy in DEVICE_ORDERS]
    names += ["oracle"]
    return names


def check_strategies(scenario: Scenario, wanted: Sequence[str]) -> list[str]:
    valid = strategy_names(scenario)
    unknown = [w for w in wanted if w not in valid]
    if unknown:
        raise UnknownNameError(
            f"unknown strategy {unknown[0]!r}; valid strategies: {', '.join(valid)}"
        )
    return list(wanted)


LARGE_DEFAULT = ("gpu-slicer-best-fit",)
"""Above this many pods the baselines' simple schedulers take minutes; ask for them by name."""
LARGE_PODS = 5000


def default_strategies(scenario: Scenario) -> list[str]:
    if len(scenario.pods) > LARGE_PODS:
        return list(LARGE_DEFAULT)
    valid = strategy_names(scenario)
    return [s for s in DEFAULT_STRATEGIES if s in valid]


def make_strategy(
    name: str, scenario: Scenario, book: DemandBook, *, through_api: bool | None = None
) -> Strategy:
    if name.startswith("gpu-slicer-"):
        from gpu_slicer.sim.cluster import GpuSlicerStrategy

        return GpuSlicerStrategy(
            scenario, book, device_order=name[len("gpu-slicer-") :], through_api=through_api
        )
    return baseline(name, scenario, book)


@dataclass
class Comparison:
    scenario: Scenario
    results: list[Result]
    problems: dict[str, list[str]]
    """Per strategy, what the end-of-run checks found (empty when clean)."""


ProgressFactory = Callable[[str], Callable[[float], None] | None]


def compare(
    scenario: Scenario,
    strategies: Sequence[str],
    *,
    progress: ProgressFactory | None = None,
    through_api: bool | None = None,
) -> Comparison:
    """Each strategy on the same trace, one after the other; every run ends with a drain check."""
    check_strategies(scenario, strategies)
    book = DemandBook(scenario)
    results: list[Result] = []
    problems: dict[str, list[str]] = {}
    for name in strategies:
        began = time.perf_counter()
        strategy = make_strategy(name, scenario, book, through_api=through_api)
        try:
            engine = Engine(scenario, strategy, progress=progress(name) if progress else None)
            result = engine.run()
            problems[name] = engine.drain()
        finally:
            strategy.close()
        result.notes = list(strategy.notes)
        result.wall_s = time.perf_counter() - began
        results.append(result)
    return Comparison(scenario, results, problems)
