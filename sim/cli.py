"""Subcommands of the sim package: ``gpu-slicer simulate``."""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys

from gpu_slicer.sim.compare import Comparison, compare, default_strategies, strategy_names
from gpu_slicer.sim.demand import scenario_policy
from gpu_slicer.sim.errors import ScenarioError, SimError, UnknownNameError
from gpu_slicer.sim.report import PLOT_FORMATS, ProgressBar, as_json, plot, table
from gpu_slicer.sim.scenario import Scenario, builtin_names, load_scenario
from gpu_slicer.sim.scheduler_cost import Outlook, scenario_outlook

DEFAULT_SCENARIO = "noon-burst"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``simulate``."""
    p = subparsers.add_parser(
        "simulate",
        help="run gpu-slicer and the alternatives on simulated GPUs and compare them",
        description=(
            "Replay a scenario (a cluster, namespace policies and a trace of pods) once per "
            "strategy and compare pods served, waits, utilization, fragmentation and MIG "
            f"churn. Shipped scenarios: {', '.join(builtin_names())}."
        ),
    )
    p.add_argument(
        "--scenario",
        default=DEFAULT_SCENARIO,
        metavar="NAME|FILE",
        help=f"a shipped scenario or a YAML file (default: {DEFAULT_SCENARIO})",
    )
    p.add_argument(
        "--strategies",
        metavar="LIST",
        help="comma-separated strategies (default: every standard one; "
        "gpu-slicer-best-fit alone above 5,000 pods)",
    )
    p.add_argument("--json", action="store_true", help="print JSON for tools instead of a table")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw pods waiting, GPU memory needed and start times per strategy "
        "(.png, .svg or .pdf)",
    )
    p.add_argument("--seed", type=int, help="seed for the scenario's random generators")
    p.add_argument(
        "--through-api",
        dest="through_api",
        action="store_true",
        default=None,
        help="run gpu-slicer through the in-memory API and the agent's gRPC services "
        "(default for scenarios up to 5,000 pods)",
    )
    p.add_argument(
        "--fast",
        dest="through_api",
        action="store_false",
        help="run gpu-slicer on the fast path (default for larger scenarios)",
    )
    p.add_argument(
        "--progress",
        action="store_true",
        help="draw the progress bar even when stderr is not a terminal",
    )
    p.set_defaults(func=run_simulate)


def run_simulate(args: argparse.Namespace) -> int:
    try:
        scenario = load_scenario(args.scenario, seed=args.seed)
        scenario_policy(scenario)  # a bad policy is bad input: refuse it before any run
        wanted = _strategies(args, scenario)
    except (UnknownNameError, ScenarioError) as exc:
        print(f"gpu-slicer simulate: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        problem = _plot_problem(args.plot)
        if problem:
            print(f"gpu-slicer simulate: --plot {args.plot}: {problem}", file=sys.stderr)
            return 2

    if args.log_level != "DEBUG":
        # The agent's per-claim logs would drown the comparison; problems still show.
        logging.getLogger("gpu_slicer.slicer").setLevel(logging.WARNING)

    def progress(name: str) -> ProgressBar | None:
        bar = ProgressBar(name, force=args.progress)
        return bar if bar.enabled and (len(scenario.pods) >= 2000 or args.progress) else None

    try:
        comparison = compare(scenario, wanted, progress=progress, through_api=args.through_api)
    except SimError as exc:
        print(f"gpu-slicer simulate: {exc}", file=sys.stderr)
        return 1
    if args.plot:
        try:
            plot(comparison, args.plot)
        except OSError as exc:
            print(f"gpu-slicer simulate: cannot write the plot: {exc}", file=sys.stderr)
            return 1
    _write(args, comparison, _outlook(scenario))
    problems = [p for ps in comparison.problems.values() for p in ps]
    return 1 if problems else 0


def _strategies(args: argparse.Namespace, scenario: Scenario) -> list[str]:
    """The strategies to run: those named (all known, else UnknownNameError) or the defaults,
    saying so on stderr when the scale leaves only gpu-slicer among them."""
    if not args.strategies:
        wanted = default_strategies(scenario)
        if len(wanted) == 1:
            print(
                f"gpu-slicer simulate: {len(scenario.pods)} pods: running {wanted[0]} only; "
                "name others with --strategies (the baselines take minutes at this scale)",
                file=sys.stderr,
            )
        return wanted
    wanted = [s.strip() for s in args.strategies.split(",") if s.strip()]
    valid = strategy_names(scenario)
    unknown = [w for w in wanted if w not in valid]
    if unknown or not wanted:
        raise UnknownNameError(
            f"unknown strategy {unknown[0] if unknown else args.strategies!r}; "
            f"valid strategies: {', '.join(valid)}"
        )
    return wanted


def _outlook(scenario: Scenario) -> Outlook | None:
    """What the real scheduler would sustain (None, with a note on stderr, without a model)."""
    try:
        return scenario_outlook(scenario)
    except ScenarioError as exc:
        print(f"gpu-slicer simulate: no scheduler outlook: {exc}", file=sys.stderr)
        return None


def _write(args: argparse.Namespace, comparison: Comparison, outlook: Outlook | None) -> None:
    """The comparison on stdout: JSON for tools, else the table (and where the plot went)."""
    if args.json:
        document = as_json(comparison)
        document["scheduler"] = outlook.as_json() if outlook else None
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(table(comparison))
        if outlook:
            sys.stdout.write("\n" + "\n".join(outlook.lines()) + "\n")
        if args.plot:
            sys.stdout.write(f"\nplot written to {os.path.abspath(args.plot)}\n")


def _plot_problem(path: str) -> str | None:
    """Why ``--plot`` could not be honoured, checked before a run that may take a minute."""
    if importlib.util.find_spec("matplotlib") is None:
        return "plotting needs matplotlib: pip install matplotlib (or the package's 'plot' extra)"
    if os.path.isdir(path):
        return "is a folder; give a file name such as utilization.png"
    extension = os.path.splitext(path)[1].lstrip(".").lower()
    if extension not in PLOT_FORMATS:
        return (
            f"the file name must end in {', '.join('.' + f for f in PLOT_FORMATS)} "
            "(the extension picks the format)"
        )
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"folder {folder} does not exist"
    if not os.access(folder, os.W_OK):
        return f"folder {folder} is not writable"
    return None
