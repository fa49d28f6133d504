"""The comparison for people (a table), for tools (JSON) and as a picture (PNG)."""

from __future__ import annotations

import io
import sys
from typing import Any, TextIO

from sim.compare import Comparison
from sim.engine import Result


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def as_json(comparison: Comparison, *, series: bool = True) -> dict[str, Any]:
    scenario = comparison.scenario
    results = []
    oracle = next((r for r in comparison.results if r.strategy == "oracle"), None)
    for r in comparison.results:
        item = r.as_dict()
        if not series:
            item.pop("series")
        if oracle is not None and oracle.served:
            item["servedVsOracle"] = round(r.served / oracle.served, 5)
        item["problems"] = comparison.problems.get(r.strategy, [])
        results.append(item)
    return {
        "scenario": {
            "name": scenario.name,
            "description": scenario.description,
            "nodes": len(scenario.nodes),
            "gpus": scenario.gpu_count,
            "pods": len(scenario.pods),
            "podEvents": scenario.events,
            "seed": scenario.seed,
            "endSeconds": scenario.end,
            "nodeRule": scenario.node_rule,
            "kubernetes": f"{scenario.kubernetes[0]}.{scenario.kubernetes[1]}",
        },
        "results": results,
    }


def table(comparison: Comparison) -> str:
    scenario = comparison.scenario
    out = io.StringIO()
    out.write(f"scenario {scenario.name}: {len(scenario.nodes)} nodes, {scenario.gpu_count} GPUs, "
              f"{len(scenario.pods)} pods ({scenario.events} pod events), seed {scenario.seed}\n")
    if scenario.description:
        out.write(f"  {scenario.description}\n")
    out.write("\n")
    oracle = next((r for r in comparison.results if r.strategy == "oracle"), None)
    header = (f"{'strategy':<30} {'served':>7} {'pending':>7} {'vs oracle':>9} {'wait mean':>9} "
              f"{'wait p95':>8} {'util':>6} {'frag':>6} {'MIG +':>6} {'MIG -':>6} {'time':>6}")
    out.write(header + "\n" + "-" * len(header) + "\n")
    for r in comparison.results:
        ratio = f"{r.served / oracle.served:.1%}" if oracle and oracle.served else "-"
        out.write(
            f"{r.strategy:<30} {r.served:>7} {r.pending:>7} {ratio:>9} "
            f"{_duration(r.wait_mean_s):>9} {_duration(r.wait_p95_s):>8} "
            f"{r.utilization_mean:>6.1%} {r.fragmentation_mean:>6.1%} {r.creations:>6} "
            f"{r.destructions:>6} {r.wall_s:>5.1f}s\n"
        )
    out.write("\nutil: memory slices held by running pods, time-weighted. frag: free memory slices "
              "no pending pod could use, mean of samples.\nMIG +/-: instances created/destroyed "
              "(static layouts: made up front). time: wall-clock seconds of the run.\n")
    workloads = sorted({w for r in comparison.results for w in r.served_by_workload})
    if 1 < len(workloads) <= 8:
        out.write("\nserved / total (mean wait) per workload:\n")
        width = max(len(w) for w in workloads) + 2
        out.write(f"{'strategy':<30}" + "".join(f"{w:>{max(width, 16)}}" for w in workloads)
                  + "\n")
        for r in comparison.results:
            cells = []
            for w in workloads:
                served, total = r.served_by_workload.get(w, (0, 0))
                mean = r.waits_by_workload.get(w, (0.0, 0.0))[0]
                cells.append(f"{served}/{total} ({_duration(mean)})")
            out.write(f"{r.strategy:<30}" + "".join(f"{c:>{max(width, 16)}}" for c in cells)
                      + "\n")
    for name, problems in comparison.problems.items():
        for problem in problems:
            out.write(f"\nPROBLEM in {name}: {problem}")
    notes = [(r.strategy, n) for r in comparison.results for n in r.notes[:3]]
    if notes:
        out.write("\nnotes:\n")
        for strategy, note in notes:
            out.write(f"  {strategy}: {note}\n")
    return out.getvalue()


def plot(comparison: Comparison, path: str) -> None:
    """Utilization over time per strategy (and fragmentation, dashed) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenario = comparison.scenario
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    for r in comparison.results:
        hours = [(scenario.clock_s + t) / 3600 for t, _, _ in r.series]
        top.step(hours, [u * 100 for _, u, _ in r.series], where="post", label=r.strategy,
                 linewidth=1.4)
        bottom.step(hours, [f * 100 for _, _, f in r.series], where="post", linewidth=1.0)
    top.set_ylabel("memory slices held (%)")
    top.set_ylim(0, 105)
    top.set_title(f"{scenario.name}: {len(scenario.nodes)} nodes, {scenario.gpu_count} GPUs, "
                  f"{len(scenario.pods)} pods")
    top.legend(loc="upper left", fontsize=8, ncol=2)
    top.grid(alpha=0.3)
    bottom.set_ylabel("fragmented (%)")
    bottom.set_xlabel("hour of day" if scenario.clock_s else "hours")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


class ProgressBar:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal or forced."""

    def __init__(self, label: str, stream: TextIO | None = None, *, force: bool = False) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = force or self.stream.isatty()
        self.last = -1

    def __call__(self, fraction: float) -> None:
        if not self.enabled:
            return
        percent = int(fraction * 100)
        if percent == self.last:
            return
        self.last = percent
        filled = percent * 30 // 100
        self.stream.write(f"\r{self.label:<30} [{'#' * filled}{'.' * (30 - filled)}] "
                          f"{percent:3d}%")
        if percent >= 100:
            self.stream.write("\n")
        self.stream.flush()


def summary_line(result: Result) -> str:
    return f"{result.strategy}: served {result.served}/{result.total}"
