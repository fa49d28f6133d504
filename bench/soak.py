"""Soak: admissions and prepares in a burst while webhook workers are killed and the agent restarts.

Loopback and temporary folders only, bounded by ``--seconds``. Two halves run at the same time:

- **Webhook**: gunicorn (webhook/gunicorn.conf.py, ``--workers`` workers, TLS, dev mode) serves
  ``--clients`` keep-alive clients sending converted-pod reviews back to back, while a killer
  SIGKILLs one worker every ``--kill-every`` seconds (the master starts a new one). A failed
  review is classified: *in flight at a kill* (a kill happened while it was being answered),
  *on a connection a kill closed while idle* (the client learns of it only when it writes; Go's
  HTTP client, which the apiserver uses, retries those, and so does this one, once, on a new
  connection), or *other*, which must be zero.
- **Agent**: a node agent (real gRPC over unix sockets, simulated H100 GPUs, an in-memory
  cluster) serves a kubelet stand-in that prepares and unprepares claims on every 1g.10gb
  placement of two GPUs, retrying as the kubelet does while the agent is down, while the agent
  is stopped and started again on the same folders and GPUs every ``--restart-every`` seconds.
  After every successful prepare the claim's MIG instance must exist; at the end every claim is
  unprepared and deleted, and no MIG instance, checkpoint entry or CDI spec may be left.

Prints the figures; ``soak()`` returns them (tests/test_soak.py runs a short one).

    python bench/soak.py [--seconds 60] [--workers 2] [--clients 4] [--kill-every 2]
                         [--restart-every 3]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_webhook import CONVERTED, _start_server, process_stats, review  # noqa: E402

NODE = "soak-node"


@dataclass
class Figures:
    seconds: float = 0.0
    admissions_ok: int = 0
    failed_in_flight_at_kill: int = 0
    retried_after_idle_close: int = 0
    failed_other: int = 0
    worker_kills: int = 0
    prepares_ok: int = 0
    unprepares_ok: int = 0
    kubelet_retries: int = 0
    agent_restarts: int = 0
    lost_claims: int = 0
    leaked_instances: int = 0
    leftover_checkpoint_entries: int = 0
    leftover_cdi_specs: int = 0
    problems: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- webhook half


def _workers(master: int) -> list[int]:
    return [pid for pid in process_stats(master) if pid != master]


class Admissions:
    def __init__(self, port: int, context: ssl.SSLContext, figures: Figures) -> None:
        self.port, self.context, self.figures = port, context, figures
        self.kills: list[float] = []
        self.lock = threading.Lock()

    def _connect(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=30)

    def _post(self, conn: http.client.HTTPSConnection, body: bytes) -> int:
        conn.request(
            "POST", "/mutate-pods", body=body, headers={"Content-Type": "application/json"}
        )
        reply = conn.getresponse()
        reply.read()
        return reply.status

    def client(self, index: int, stop: threading.Event) -> None:
        conn = self._connect()
        previous = time.monotonic()  # when the last answered request on this connection began
        count = 0
        while not stop.is_set():
            count += 1
            body = review(CONVERTED, f"soak-{index}-{count}")
            started = time.monotonic()
            try:
                status = self._post(conn, body)
            except (OSError, http.client.HTTPException) as error:
                ended = time.monotonic()
                conn.close()
                conn = self._connect()
                with self.lock:
                    during = any(started <= k <= ended for k in self.kills)
                    # a worker killed after writing the previous answer: the answer was read,
                    # but the connection is gone
                    idle_kill = any(previous <= k < started for k in self.kills)
                if during:
                    with self.lock:
                        self.figures.failed_in_flight_at_kill += 1
                    continue
                if idle_kill:
                    try:
                        status = self._post(conn, body)
                    except (OSError, http.client.HTTPException) as exc:
                        with self.lock:
                            self.figures.failed_other += 1
                            self.figures.problems.append(f"retry failed: {exc!r}")
                        conn.close()
                        conn = self._connect()
                        continue
                    with self.lock:
                        self.figures.retried_after_idle_close += 1
                else:
                    with self.lock:
                        self.figures.failed_other += 1
                        self.figures.problems.append(
                            f"admission failed with no kill near it after {ended - started:.3f} "
                            f"s: {error!r}"
                        )
                    continue
            with self.lock:
                if status == 200:
                    self.figures.admissions_ok += 1
                else:
                    self.figures.failed_other += 1
                    self.figures.problems.append(f"admission answered {status}")
            previous = started
        conn.close()

    def killer(self, master: int, every_s: float, stop: threading.Event) -> None:
        rng = random.Random(7)
        while not stop.wait(every_s):
            workers = _workers(master)
            if not workers:
                continue
            victim = rng.choice(workers)
            with self.lock:
                self.kills.append(time.monotonic())
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                continue
            with self.lock:
                self.kills.append(time.monotonic())
                self.figures.worker_kills += 1


# ----------------------------------------------------------------------------- agent half


class Kubelet:
    """Prepares and unprepares claims on fixed placements, retrying while the agent is down."""

    def __init__(self, root: Path, figures: Figures) -> None:
        from gpu_slicer.kube.memory import InMemoryKubeApi
        from gpu_slicer.slicer.agent import AgentConfig
        from gpu_slicer.slicer.simulated import SimulatedBackend

        self.figures = figures
        self.api = InMemoryKubeApi()
        self.backend = SimulatedBackend("H100-80GB:2", node_name=NODE)
        self.config = AgentConfig(
            node=NODE,
            checkpoint_dir=root / "ckpt",
            cdi_dir=root / "cdi",
            plugins_dir=root / "plugins",
            registry_dir=root / "reg",
            metrics_bind="",
            reconcile_interval_s=0.2,
        )
        self.agent_lock = threading.Lock()
        self.agent: Any = None
        self._start_agent()
        self.devices = [f"gpu-{g}-mig-1g10gb-{s}" for g in (0, 1) for s in range(7)]

    def _start_agent(self) -> None:
        from gpu_slicer.slicer.agent import NodeAgent

        agent = NodeAgent(self.config, backend=self.backend, api=self.api)
        agent.start()
        self.agent = agent

    def restarter(self, every_s: float, stop: threading.Event) -> None:
        while not stop.wait(every_s):
            with self.agent_lock:
                self.agent.stop()
                time.sleep(0.2)  # the kubelet sees the sockets gone
                self._start_agent()
                self.figures.agent_restarts += 1

    def _call(self, method: str, claim: dict[str, Any]) -> Any:
        """One kubelet call, retried until it succeeds (the kubelet retries failed calls)."""
        import grpc

        from gpu_slicer.slicer.plugin import dra_socket
        from gpu_slicer.slicer.proto import dra_v1_pb2, dra_v1_pb2_grpc

        meta = claim["metadata"]
        message = dra_v1_pb2.Claim(namespace=meta["namespace"], uid=meta["uid"], name=meta["name"])
        deadline = time.monotonic() + 60
        while True:
            path = dra_socket(self.config.plugins_dir)
            try:
                with grpc.insecure_channel(f"unix://{path}") as channel:
                    stub = dra_v1_pb2_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
                    if method == "prepare":
                        reply = stub.NodePrepareResources(
                            dra_v1_pb2.NodePrepareResourcesRequest(claims=[message]), timeout=10
                        )
                    else:
                        reply = stub.NodeUnprepareResources(
                            dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[message]), timeout=10
                        )
                result = reply.claims[meta["uid"]]
                if not result.error:
                    return result
                error = result.error
            except grpc.RpcError as exc:
                error = str(exc.code())
            self.figures.kubelet_retries += 1
            if time.monotonic() > deadline:
                raise RuntimeError(f"{method} of {meta['name']} kept failing: {error}")
            time.sleep(0.1)

    def slot(self, device: str, stop: threading.Event) -> None:
        from gpu_slicer.core.devices import parse_device_name
        from gpu_slicer.core.identity import DRIVER

        spec = parse_device_name(device)
        count = 0
        while not stop.is_set():
            count += 1
            claim = self.api.create(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": f"{device}-{count}", "namespace": "ml"},
                    "spec": {
                        "devices": {
                            "requests": [
                                {"name": "gpu", "exactly": {"deviceClassName": "mig.gpu-slicer.io"}}
                            ]
                        }
                    },
                    "status": {
                        "allocation": {
                            "devices": {
                                "results": [
                                    {
                                        "request": "gpu",
                                        "driver": DRIVER,
                                        "pool": NODE,
                                        "device": device,
                                    }
                                ]
                            }
                        }
                    },
                }
            )
            self._call("prepare", claim)
            self.figures.prepares_ok += 1
            held = [
                i
                for i in self.backend.instances(spec.gpu_index)
                if i.start == spec.start and i.profile == "1g.10gb"
            ]
            if not held:
                self.figures.lost_claims += 1
                self.figures.problems.append(f"{claim['metadata']['name']}: prepared, no instance")
            time.sleep(random.uniform(0.0, 0.2))  # the pod runs
            self._call("unprepare", claim)
            self.figures.unprepares_ok += 1
            self.api.delete("resource.k8s.io/v1", "ResourceClaim", claim["metadata"]["name"], "ml")

    def check_clean(self) -> None:
        """Nothing left once every claim is unprepared and deleted: no instance, entry, spec."""
        deadline = time.monotonic() + 10
        while True:
            instances = [
                i
                for info in self.backend.gpus()
                if info.mig_enabled
                for i in self.backend.instances(info.index)
            ]
            checkpoint = self.config.checkpoint_dir / "checkpoint.json"
            entries = (
                json.loads(checkpoint.read_text())["data"].get("claims", {})
                if checkpoint.exists()
                else {}
            )
            specs = list(self.config.cdi_dir.glob("*.json"))
            if not (instances or entries or specs) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.figures.leaked_instances = len(instances)
        self.figures.leftover_checkpoint_entries = len(entries)
        self.figures.leftover_cdi_specs = len(specs)

    def close(self) -> None:
        with self.agent_lock:
            self.agent.stop()
        self.api.close()


# ----------------------------------------------------------------------------- main


def soak(
    seconds: float,
    *,
    workers: int = 2,
    clients: int = 4,
    kill_every_s: float = 2.0,
    restart_every_s: float = 3.0,
    min_faults: int = 0,
    max_seconds: float = 120.0,
) -> Figures:
    """Run for ``seconds``, then on until each fault happened ``min_faults`` times (a loaded
    machine restarts the agent more slowly than the schedule asks), ``max_seconds`` at most."""
    figures = Figures()
    folder = Path(tempfile.mkdtemp(prefix="gs-soak-", dir="/tmp"))  # short unix socket paths
    process: subprocess.Popen[bytes] | None = None
    kubelet: Kubelet | None = None
    try:
        (folder / "webhook").mkdir()
        process, port, cert = _start_server(folder / "webhook", workers)
        admissions = Admissions(port, ssl.create_default_context(cafile=str(cert)), figures)
        kubelet = Kubelet(folder / "agent", figures)
        stop = threading.Event()
        threads = [
            threading.Thread(target=admissions.client, args=(i, stop)) for i in range(clients)
        ]
        threads += [threading.Thread(target=kubelet.slot, args=(d, stop)) for d in kubelet.devices]
        threads += [
            threading.Thread(target=admissions.killer, args=(process.pid, kill_every_s, stop)),
            threading.Thread(target=kubelet.restarter, args=(restart_every_s, stop)),
        ]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        time.sleep(seconds)
        deadline = started + max(seconds, max_seconds)
        while (
            min(figures.worker_kills, figures.agent_restarts) < min_faults
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
        figures.seconds = time.monotonic() - started
        kubelet.check_clean()
    finally:
        if kubelet is not None:
            kubelet.close()
        if process is not None:
            process.terminate()
            process.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--kill-every", type=float, default=2.0)
    parser.add_argument("--restart-every", type=float, default=3.0)
    args = parser.parse_args()
    f = soak(
        args.seconds,
        workers=args.workers,
        clients=args.clients,
        kill_every_s=args.kill_every,
        restart_every_s=args.restart_every,
    )
    print(f"soak of {f.seconds:.0f} s on {os.cpu_count()} CPUs")
    print(
        f"webhook: {f.admissions_ok} admissions answered, {f.worker_kills} workers killed; "
        f"{f.failed_in_flight_at_kill} failed in flight at a kill, "
        f"{f.retried_after_idle_close} retried after a kill closed their idle connection, "
        f"{f.failed_other} other failures"
    )
    print(
        f"agent: {f.prepares_ok} prepares and {f.unprepares_ok} unprepares on 14 placements, "
        f"{f.agent_restarts} restarts, {f.kubelet_retries} kubelet retries while it was down; "
        f"{f.lost_claims} lost claims, {f.leaked_instances} leaked MIG instances, "
        f"{f.leftover_checkpoint_entries} checkpoint entries and {f.leftover_cdi_specs} CDI "
        f"specs left"
    )
    for problem in f.problems[:20]:
        print(f"  problem: {problem}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
