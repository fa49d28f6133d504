"""The comparison for people (a table), for tools (JSON) and as a picture (PNG)."""

from __future__ import annotations

import io
import sys
from dataclasses import dataclass
from typing import Any, TextIO

from gpu_slicer.sim.compare import Comparison
from gpu_slicer.sim.event_loop import Result
from gpu_slicer.sim.scenario import Scenario


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
    out.write(
        f"scenario {scenario.name}: {len(scenario.nodes)} nodes, {scenario.gpu_count} GPUs, "
        f"{len(scenario.pods)} pods ({scenario.events} pod events), seed {scenario.seed}\n"
    )
    if scenario.description:
        out.write(f"  {scenario.description}\n")
    out.write("\n")
    oracle = next((r for r in comparison.results if r.strategy == "oracle"), None)
    header = (
        f"{'strategy':<30} {'served':>7} {'pending':>7} {'vs oracle':>9} {'wait mean':>9} "
        f"{'wait p95':>8} {'util':>6} {'frag':>6} {'MIG +':>6} {'MIG -':>6} {'time':>6}"
    )
    out.write(header + "\n" + "-" * len(header) + "\n")
    for r in comparison.results:
        ratio = f"{r.served / oracle.served:.1%}" if oracle and oracle.served else "-"
        out.write(
            f"{r.strategy:<30} {r.served:>7} {r.pending:>7} {ratio:>9} "
            f"{_duration(r.wait_mean_s):>9} {_duration(r.wait_p95_s):>8} "
            f"{r.utilization_mean:>6.1%} {r.fragmentation_mean:>6.1%} {r.creations:>6} "
            f"{r.destructions:>6} {r.wall_s:>5.1f}s\n"
        )
    out.write(
        "\nutil: memory slices held by running pods, time-weighted. frag: free memory slices "
        "no pending pod could use, mean of samples.\nMIG +/-: instances created/destroyed "
        "(static layouts: made up front). time: wall-clock seconds of the run.\n"
    )
    workloads = sorted({w for r in comparison.results for w in r.served_by_workload})
    if 1 < len(workloads) <= 8:
        out.write("\nserved / total (mean wait) per workload:\n")
        rows = [["strategy", *workloads]]
        for r in comparison.results:
            cells = [r.strategy]
            for w in workloads:
                served, total = r.served_by_workload.get(w, (0, 0))
                mean = r.waits_by_workload.get(w, (0.0, 0.0))[0]
                cells.append(f"{served}/{total} ({_duration(mean)})")
            rows.append(cells)
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            # Two spaces between columns however long a name or a cell gets.
            out.write(
                row[0].ljust(widths[0])
                + "".join(
                    "  " + cell.rjust(width)
                    for cell, width in zip(row[1:], widths[1:], strict=True)
                )
                + "\n"
            )
    for name, problems in comparison.problems.items():
        for problem in problems:
            out.write(f"\nPROBLEM in {name}: {problem}")
    notes = [(r.strategy, n) for r in comparison.results for n in r.notes[:3]]
    if notes:
        out.write("\nnotes:\n")
        for strategy, note in notes:
            out.write(f"  {strategy}: {note}\n")
    return out.getvalue()


PLOT_FORMATS = ("png", "svg", "pdf")
"""File types ``--plot`` writes (matplotlib picks the format from the extension)."""

_STYLES = ("-", "--", "-.", ":")


@dataclass(frozen=True)
class Timeline:
    """What the plot shows of one strategy's run, computed from its result."""

    label: str
    times_h: list[float]
    waiting: list[int]
    """Pods that have arrived and not started, at each time."""
    needed: list[float]
    """GPU memory the running pods need (their first choice), share of the cluster's."""
    on_arrival: int
    later: int
    never: int
    held_mean: float
    needed_mean: float


def pod_needs(scenario: Scenario) -> dict[str, float]:
    """Bytes of GPU memory each pod needs: its first choice as the webhook translates it (the
    slice right-sizing gives it, or whole GPUs), whatever a strategy hands it."""
    from gpu_slicer.sim.demand import DemandBook

    book = DemandBook(scenario)
    models = [m for node in scenario.nodes for m in node.models]
    gpu_bytes = sum(m.memory_bytes for m in models) / max(1, len(models))
    profile_bytes = {p.name: float(p.memory_bytes) for m in reversed(models) for p in m.profiles}
    needs: dict[str, float] = {}
    for pod in scenario.pods:
        chains = book.translated(pod).chains or book.static(pod)
        total = 0.0
        for request in chains:
            first = request[0]
            each = gpu_bytes if first.kind == "gpu" else profile_bytes.get(first.profile or "", 0.0)
            total += first.count * each
        needs[pod.name] = total
    return needs


def timelines(comparison: Comparison) -> list[Timeline]:
    """One timeline per distinct behaviour: strategies whose pods started at exactly the same
    moments share one line (and one label), so no line hides another."""
    scenario = comparison.scenario
    needs = pod_needs(scenario)
    capacity = sum(m.memory_bytes for n in scenario.nodes for m in n.models) or 1.0
    arrived = [p for p in scenario.pods if p.arrival <= scenario.end]
    groups: dict[tuple[tuple[str, float], ...], list[Result]] = {}
    for r in comparison.results:
        groups.setdefault(tuple(sorted(r.starts.items())), []).append(r)
    out = []
    for members in groups.values():
        first = members[0]
        times = [t for t, _, _ in first.series] or [0.0]
        events: list[tuple[float, int, float]] = []  # (time, waiting delta, need delta)
        on_arrival = later = 0
        for pod in arrived:
            start = first.starts.get(pod.name)
            events.append((pod.arrival, 1, 0.0))
            if start is None:
                continue
            on_arrival += start == pod.arrival
            later += start != pod.arrival
            events.append((start, -1, needs[pod.name]))
            if start + pod.duration < scenario.end:  # still running at the end: no drop
                events.append((start + pod.duration, 0, -needs[pod.name]))
        events.sort(key=lambda e: e[0])
        waiting, needed = [], []
        i, count, need = 0, 0, 0.0
        for t in times:
            while i < len(events) and events[i][0] <= t:
                count += events[i][1]
                need += events[i][2]
                i += 1
            waiting.append(count)
            needed.append(max(0.0, need) / capacity)
        label = " = ".join(r.strategy for r in members)
        out.append(
            Timeline(
                label=label,
                times_h=[(scenario.clock_s + t) / 3600 for t in times],
                waiting=waiting,
                needed=needed,
                on_arrival=on_arrival,
                later=later,
                never=len(arrived) - on_arrival - later,
                held_mean=first.utilization_mean,
                needed_mean=sum(needed) / len(needed) if needed else 0.0,
            )
        )
    return out


def plot(comparison: Comparison, path: str) -> None:
    """Pods waiting, the GPU memory running pods need, and when pods started, per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenario = comparison.scenario
    lines = timelines(comparison)
    colors = [plt.get_cmap("tab10")(i) for i in range(10)]
    fig = plt.figure(figsize=(13, 10))
    grid = fig.add_gridspec(3, 1, height_ratios=[3, 3, 2], hspace=0.45)
    waiting_ax = fig.add_subplot(grid[0])
    used_ax = fig.add_subplot(grid[1], sharex=waiting_ax)
    bars_ax = fig.add_subplot(grid[2])
    for n, line in enumerate(lines):
        style: dict[str, Any] = {
            "color": colors[n % len(colors)],
            "linestyle": _STYLES[n % len(_STYLES)],
            "linewidth": 2.2 - 0.25 * (n % 4),
        }
        waiting_ax.step(line.times_h, line.waiting, where="post", label=line.label, **style)
        used_ax.step(
            line.times_h,
            [u * 100 for u in line.needed],
            where="post",
            label=f"{line.label}: needed {line.needed_mean:.0%}, held {line.held_mean:.0%} (means)",
            **style,
        )
    waiting_ax.set_title(
        f"{scenario.name}: {len(scenario.nodes)} nodes, {scenario.gpu_count} "
        f"GPUs, {len(scenario.pods)} pods — pods waiting for a GPU"
    )
    waiting_ax.set_ylabel("pods waiting")
    waiting_ax.set_ylim(bottom=0)
    used_ax.set_title(
        "GPU memory the running pods need (their first choice), % of the "
        "cluster's; 'held' counts whole GPUs and oversized slices as in use"
    )
    used_ax.set_ylabel("needed (%)")
    used_ax.set_ylim(0, 105)
    used_ax.set_xlabel("hour of day" if scenario.clock_s else "hours")
    for ax in (waiting_ax, used_ax):
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    names = [line.label for line in lines]
    ys = range(len(lines))
    on_arrival = [line.on_arrival for line in lines]
    later = [line.later for line in lines]
    never = [line.never for line in lines]
    bars_ax.barh(ys, on_arrival, color="#2ca02c", label="started on arrival")
    bars_ax.barh(ys, later, left=on_arrival, color="#ff7f0e", label="started after waiting")
    bars_ax.barh(
        ys,
        never,
        left=[a + b for a, b in zip(on_arrival, later, strict=True)],
        color="#d62728",
        label="never started",
    )
    for y, line in zip(ys, lines, strict=True):
        bars_ax.text(
            line.on_arrival + line.later + line.never,
            y,
            f"  {line.on_arrival} / {line.later} / {line.never}",
            va="center",
            fontsize=8,
        )
    bars_ax.set_yticks(list(ys), names, fontsize=8)
    bars_ax.invert_yaxis()
    bars_ax.set_xlabel("pods")
    bars_ax.set_title("when pods started (on arrival / after waiting / never)")
    most = max((line.on_arrival + line.later + line.never for line in lines), default=1)
    bars_ax.set_xlim(0, most * 1.15)  # room for the counts after each bar
    bars_ax.legend(
        loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3, fontsize=8, frameon=False
    )
    fig.savefig(path, dpi=110, bbox_inches="tight")
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
        self.stream.write(f"\r{self.label:<30} [{'#' * filled}{'.' * (30 - filled)}] {percent:3d}%")
        if percent >= 100:
            self.stream.write("\n")
        self.stream.flush()
