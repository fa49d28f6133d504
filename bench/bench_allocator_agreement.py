"""Agreement of the simulator's allocator model with the real kube-scheduler, measured.

Starts a sandbox (``gpu-slicer sandbox up``: Kubernetes 1.36 control plane, the webhook, one
agent per node on simulated GPUs, kubelet stand-ins) with nodes of several shapes, then replays
claims ONE AT A TIME through the real scheduler and, before each, asks ``sim.allocator`` the same
question:

1. create the ResourceClaim (the spec the webhook's template gives the pod): every claim counts
   as demand, so a node that does not advertise its profile yet republishes first;
2. wait until the node's ResourceSlices are settled (no write for ``--settle`` seconds, the pool
   complete): the agent also republishes a new device order (best-fit) shortly after every
   allocation change, and the scheduler must see the slices this script reads;
3. read every ResourceSlice, every DeviceClass and every allocated ResourceClaim back from the
   apiserver and ask the model (``sim.agreement.model_outcome``) what it would allocate on the
   node (asked again if the pool still moved while the scheduler decided);
4. create a pod that uses the claim (``resourceClaimName``), pinned to the node by a
   ``kubernetes.io/hostname`` nodeSelector (so the scheduler decides; ``spec.nodeName`` would
   bypass it), and wait until the claim is allocated or the pod is Unschedulable;
5. compare: same subrequest of every request and same devices (or both unschedulable).

Workloads: the ``noon-burst`` scenario on its own A100-80GB node, and a mixed set of 60 pods over
A100-80GB:1, H100-80GB:2, A30-24GB:2 and H200-141GB:1 nodes (MIG profiles, firstAvailable chains
from memory annotations and profile lists, whole GPUs, counts of two with the NVLink
``matchAttribute`` constraint, two requests in one claim). Pods arrive and depart in time order
(``sim.agreement.ReplayOrder``); a pod that did not fit is deleted and tried again after the next
departure from its node. Prints each step, each difference and the agreement rates. Loopback
only; stops the sandbox on exit, errors and Ctrl-C included.

    python bench/bench_allocator_agreement.py [--state-dir /tmp/agr] [--mixed 60] [--json F]

The agents run with ``GPU_SLICER_REPUBLISH_INTERVAL`` (``--republish-interval``, default 0.5 s
here instead of 10 s) so that a reorder lands quickly and each step settles in about 2 s.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_slicer.kube.client import RealKubeApi  # noqa: E402
from gpu_slicer.kube.errors import NotFound  # noqa: E402
from gpu_slicer.sandbox import launch  # noqa: E402
from gpu_slicer.sandbox.errors import StartupError  # noqa: E402
from gpu_slicer.sim.agreement import (  # noqa: E402
    ALLOCATED,
    ERROR,
    UNSCHEDULABLE,
    Outcome,
    ReplayOrder,
    ReplayPod,
    Step,
    agreement,
    mixed_pods,
    model_outcome,
    noon_burst_pods,
    outcome_of_allocation,
)

Obj = dict[str, Any]
NAMESPACE = "agree"
RESOURCE = "resource.k8s.io/v1"
NOON_NODE = ("noon", "A100-80GB:1")
MIXED_NODES = {"a100": "A100-80GB", "a30": "A30-24GB", "h100": "H100-80GB", "h200": "H200-141GB"}
MIXED_SPECS = {
    "a100": "A100-80GB:1",
    "a30": "A30-24GB:2",
    "h100": "H100-80GB:2",
    "h200": "H200-141GB:1",
}


class Deadline(Exception):
    pass


def wait_for(what: str, check: Callable[[], Any], timeout_s: float, every_s: float = 0.1) -> Any:
    end = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > end:
            raise Deadline(f"no {what} within {timeout_s:.0f} s")
        time.sleep(every_s)


class Replay:
    def __init__(self, api: RealKubeApi, *, settle_s: float, verbose: bool) -> None:
        self.api = api
        self.settle_s = settle_s
        self.verbose = verbose
        self.steps: dict[str, list[Step]] = {}
        self.workload = ""
        self.slice_moves = 0
        self.attempts: dict[str, int] = {}

    # --- reading the cluster ------------------------------------------------------------

    def node_slices(self, node: str) -> list[Obj]:
        return self.api.list(
            RESOURCE, "ResourceSlice", field_selector=f"spec.nodeName={node}"
        ).items

    def settled_slices(self, node: str) -> list[Obj]:
        """Every ResourceSlice, once ``node``'s pool has not been written for ``settle_s``
        and is complete (one generation, ``resourceSliceCount`` slices)."""

        def signature() -> tuple[Any, ...]:
            items = self.node_slices(node)
            gens = {int(s["spec"]["pool"].get("generation", 0)) for s in items}
            counts = {int(s["spec"]["pool"].get("resourceSliceCount", 1)) for s in items}
            complete = len(gens) == 1 and counts == {len(items)}
            return (
                complete,
                tuple(
                    sorted((s["metadata"]["name"], s["metadata"]["resourceVersion"]) for s in items)
                ),
            )

        last = signature()
        since = time.monotonic()
        end = since + 60
        while time.monotonic() < end:
            time.sleep(0.25)
            now = signature()
            if now != last:
                last, since = now, time.monotonic()
            elif now[0] and time.monotonic() - since >= self.settle_s:
                return self.api.list(RESOURCE, "ResourceSlice").items
        raise Deadline(f"slices of {node} still changing after 60 s")

    def allocated_claims(self) -> list[Obj]:
        return [
            c
            for c in self.api.list(RESOURCE, "ResourceClaim").items
            if (c.get("status") or {}).get("allocation")
        ]

    def device_classes(self) -> dict[str, Obj]:
        return {c["metadata"]["name"]: c for c in self.api.list(RESOURCE, "DeviceClass").items}

    # --- one step -----------------------------------------------------------------------

    def place(self, pod: ReplayPod, attempt: int) -> bool:
        name = f"{pod.name}-{attempt}"
        allocated = self.allocated_claims()
        # The claim first: every claim counts as demand, so a node that did not advertise its
        # profile yet republishes (docs/agent.md) before the slices are read and the pod exists.
        claim = self.api.create(
            {
                "apiVersion": RESOURCE,
                "kind": "ResourceClaim",
                "metadata": {
                    "name": name,
                    "namespace": NAMESPACE,
                    "labels": {"agreement/workload": self.workload},
                },
                "spec": pod.claim_spec,
            }
        )
        slices = self.settled_slices(pod.node)
        generation = _generation(slices, pod.node)
        model = model_outcome(
            claim,
            node=pod.node,
            slices=slices,
            device_classes=self.device_classes(),
            allocated_claims=allocated,
        )
        self.api.create(_pod(name, pod.node, pod.claim_spec))
        real, note = self._decision(name, model)
        after = _generation(self.node_slices(pod.node), pod.node)
        if after != generation and model.status != ALLOCATED:
            # The agent republished for the claim's new profile only after the slices were
            # read (later than --settle): the model is asked again on the new pool.
            model = model_outcome(
                claim,
                node=pod.node,
                slices=self.settled_slices(pod.node),
                device_classes=self.device_classes(),
                allocated_claims=allocated,
            )
            note = _join(
                note, f"republished for a new profile (generation {generation} -> {after})"
            )
        elif after != generation and real.status != ALLOCATED:
            note = _join(note, f"pool generation {generation} -> {after} during the step")
            self.slice_moves += 1
        step = Step(pod.workload, name, pod.node, real, model, note)
        self.steps.setdefault(self.workload, []).append(step)
        mark = "=" if step.agrees else "X"
        print(
            f"  {mark} {name:<22} {pod.node:<5} scheduler: {real.describe()}"
            + ("" if step.agrees else f"\n    {'':<22}       model:     {model.describe()}")
            + (f"  [{note}]" if note else ""),
            flush=True,
        )
        if real.status == ALLOCATED:
            wait_for(f"pod {name} Running", lambda: self._phase(name) == "Running", 60)
            return True
        self._delete(name)
        return False

    def _decision(self, name: str, model: Outcome) -> tuple[Outcome, str]:
        """The scheduler's outcome: the claim's allocation, or the pod Unschedulable. A pod
        found Unschedulable while the model allocates gets 15 s more (a retry after slices
        settled in the scheduler's cache would still allocate it; that is noted)."""
        end = time.monotonic() + 60
        unschedulable_since: float | None = None
        message = ""
        while time.monotonic() < end:
            claim = self.api.get(RESOURCE, "ResourceClaim", name, NAMESPACE)
            allocation = (claim.get("status") or {}).get("allocation")
            if allocation:
                note = "allocated on a retry" if unschedulable_since is not None else ""
                return outcome_of_allocation(allocation), note
            pod = self.api.get("v1", "Pod", name, NAMESPACE)
            for condition in (pod.get("status") or {}).get("conditions") or []:
                if (
                    condition.get("type") == "PodScheduled"
                    and condition.get("status") == "False"
                    and condition.get("reason") == "Unschedulable"
                ):
                    message = str(condition.get("message", ""))
                    if unschedulable_since is None:
                        unschedulable_since = time.monotonic()
            if unschedulable_since is not None:
                grace = 15.0 if model.status == ALLOCATED else 0.5
                if time.monotonic() - unschedulable_since >= grace:
                    return Outcome(UNSCHEDULABLE, message=_short(message)), ""
            time.sleep(0.1)
        return Outcome(ERROR, message="no decision within 60 s"), ""

    def _phase(self, name: str) -> str:
        pod = self.api.get("v1", "Pod", name, NAMESPACE)
        return str((pod.get("status") or {}).get("phase", ""))

    def release(self, pod: ReplayPod) -> None:
        attempt = max(0, self.attempts.get(pod.name, 1) - 1)
        self._delete(f"{pod.name}-{attempt}")
        if self.verbose:
            print(f"    - {pod.name} leaves {pod.node}", flush=True)

    def _delete(self, name: str) -> None:
        for kind in (("v1", "Pod"), (RESOURCE, "ResourceClaim")):
            try:
                self.api.delete(kind[0], kind[1], name, NAMESPACE)
            except NotFound:
                continue

            def gone(k: tuple[str, str] = kind) -> bool:
                try:
                    self.api.get(k[0], k[1], name, NAMESPACE)
                except NotFound:
                    return True
                return False

            wait_for(f"{kind[1]} {name} deleted", gone, 60)

    def run(self, label: str, pods: list[ReplayPod]) -> list[Step]:
        self.workload = label
        print(f"{label}: {len(pods)} pods", flush=True)
        timeline = ReplayOrder(pods)
        self.attempts = timeline.attempts
        timeline.run(self.place, self.release)  # every placed pod also departs
        return self.steps.get(label, [])


def _generation(slices: list[Obj], node: str) -> int:
    return max(
        (
            int(s["spec"]["pool"].get("generation", 0))
            for s in slices
            if s["spec"].get("nodeName") == node
        ),
        default=0,
    )


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


def _short(text: str) -> str:
    return text if len(text) <= 160 else text[:157] + "..."


def _pod(name: str, node: str, claim_spec: Obj) -> Obj:
    requests = [r["name"] for r in claim_spec["devices"]["requests"]]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [
                {
                    "name": f"c{i}",
                    "image": "registry.example/app:1",
                    "resources": {"claims": [{"name": "gpu", "request": r}]},
                }
                for i, r in enumerate(requests)
            ],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
        },
    }


def start_sandbox(folder: Path, interval: str) -> subprocess.Popen[bytes]:
    nodes = {NOON_NODE[0]: NOON_NODE[1], **MIXED_SPECS}
    return launch.launch(folder, nodes, env={"GPU_SLICER_REPUBLISH_INTERVAL": interval})


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path("/tmp/agr"),
        help="the sandbox's folder (short: unix socket paths)",
    )
    parser.add_argument("--mixed", type=int, default=60, help="pods in the mixed set (>= 50)")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument(
        "--saturated",
        action="store_true",
        help="the mixed set over one hour, pods running 10-40 min (most steps "
        "then find nodes full)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=2.0,
        help="seconds a node's slices must stay unwritten before a step",
    )
    parser.add_argument(
        "--republish-interval", default="0.5", help="the agents' GPU_SLICER_REPUBLISH_INTERVAL"
    )
    parser.add_argument("--only", choices=["noon-burst", "mixed"], default=None)
    parser.add_argument("--json", type=Path, default=None, help="write every step here")
    parser.add_argument(
        "--timeout", type=float, default=1800, help="give up (and clean up) after this many seconds"
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse_args()


def replay_sets(replay: Replay, args: argparse.Namespace) -> None:
    """The sets ``--only`` asks for, in turn."""
    if args.only in (None, "noon-burst"):
        replay.run("noon-burst", noon_burst_pods(NOON_NODE[0]))
    if args.only in (None, "mixed"):
        if args.saturated:
            pods = mixed_pods(
                MIXED_NODES,
                count=args.mixed,
                seed=args.seed,
                span_s=3600.0,
                durations=(600.0, 1200.0, 1800.0, 2400.0),
            )
        else:
            pods = mixed_pods(MIXED_NODES, count=args.mixed, seed=args.seed)
        replay.run("mixed", pods)


def report(replay: Replay, interrupted: str, started: float) -> list[Step]:
    """The differences and agreement figures printed; returns every step."""
    print()
    if interrupted:
        print(f"stopped early ({interrupted}): figures cover the steps done")
    for label, steps in replay.steps.items():
        differences = [s.difference() for s in steps if not s.agrees]
        print(f"{label}: differences ({len(differences)})")
        for line in differences:
            print(f"  {line}")
    for label, steps in replay.steps.items():
        print(agreement(steps).line(label))
    everything = [s for steps in replay.steps.values() for s in steps]
    print(agreement(everything).line("all"))
    print(
        f"steps whose node's pool moved while the scheduler decided: {replay.slice_moves}; "
        f"wall time {time.monotonic() - started:.0f} s"
    )
    return everything


def write_json(path: Path, replay: Replay) -> None:
    path.write_text(
        json.dumps(
            {
                label: [
                    {
                        "workload": s.workload,
                        "claim": s.claim,
                        "node": s.node,
                        "agrees": s.agrees,
                        "note": s.note,
                        "scheduler": {
                            "status": s.real.status,
                            "results": s.real.results,
                            "message": s.real.message,
                        },
                        "model": {
                            "status": s.model.status,
                            "results": s.model.results,
                            "message": s.model.message,
                        },
                    }
                    for s in steps
                ]
                for label, steps in replay.steps.items()
            },
            indent=1,
        )
        + "\n"
    )


def main() -> int:
    args = parse_args()

    def on_alarm(signum: int, frame: Any) -> None:
        raise Deadline(f"the run took more than {args.timeout:.0f} s")

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, on_term)
    signal.alarm(int(args.timeout))
    args.state_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    process = start_sandbox(args.state_dir, args.republish_interval)
    replay: Replay | None = None
    interrupted = ""
    try:
        ready = launch.wait_ready(args.state_dir, process)
        print(
            f"sandbox ready in {ready['startSeconds']} s: Kubernetes {ready['kubernetes']}, "
            f"nodes {', '.join(ready['nodes'])}",
            flush=True,
        )
        api = RealKubeApi.from_config(ready["kubeconfig"])
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        replay = Replay(api, settle_s=args.settle, verbose=args.verbose)
        replay_sets(replay, args)
    except StartupError as exc:
        print(exc, file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Deadline) as exc:
        interrupted = str(exc) or "interrupted"
    finally:
        signal.alarm(0)
        launch.stop(process)
    if replay is None:
        return 1
    everything = report(replay, interrupted, started)
    if args.json:
        write_json(args.json, replay)
    return 0 if all(s.agrees for s in everything) and not interrupted else 1


if __name__ == "__main__":
    raise SystemExit(main())
