"""Admission throughput and latency of the webhook: gunicorn over TLS on loopback.

Five request kinds against the same server (same gunicorn.conf.py and worker, TLS, Flask view,
metrics):

  (a) a typical converted pod (a Deployment's pod asking for ``nvidia.com/mig-1g.10gb``); its
      replicas are identical, so after the first one the engine's translation memo answers,
  (a') the same pod made different each time (an annotation), so the memo never answers and
      every request is read and patched; the claim its GPU request makes is derived once and
      remembered per shape (``webhook.translate``), as for pods of one workload kind,
  (a'') a pod whose GPU shape is new each time (its container's name differs too): the claim
      is derived for every request, the cost of the first pod of a new workload,
  (b) a pod with nothing to convert (CPU and memory only),
  (c) a no-op handler: the same view with an engine that only echoes the uid: the baseline.

The kinds run in interleaved rounds (rotating order, so load from elsewhere falls on all alike).
Per kind it reports requests/s, p50 and p99, and the server's CPU time per request (gunicorn
master and workers, from /proc). The cost ratios of each kind to (c) by server CPU per request
are computed per round and printed as min / median / max over the rounds: that is the figure of
the goal "the converted-pod path costs at most 1.25x a bare no-op handler".

Then two paced, open-loop runs of (a) at ``--rate`` requests/s (latency counted from when each
request was due): one alone, one while ``--stalled`` connections are held open by an attacker
in another process that reconnects whenever the server closes one (a third idle right after TCP
connect, a third idle after the TLS handshake, a third with headers and part of a body; first
opened spread over 3 s, so their reopenings after each read deadline spread out too). Each
paced run has
``--paced-requests`` samples, so its p99 rests on that many / 100 samples above it.

Clients use keep-alive connections (http.client) from ``--clients`` threads; request counts are
bounded; loopback only. Prints figures, never pass/fail: client and server share this machine's
CPUs, so compare ratios rather than absolutes.

    python bench/bench_webhook.py [--requests 4000] [--rounds 8] [--clients 4] [--workers 2]
                                  [--rate 200] [--paced-requests 3000] [--stalled 256]
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpu_slicer.sandbox.process import free_port  # noqa: E402
from gpu_slicer.webhook.config import ServerConfig  # noqa: E402
from gpu_slicer.webhook.server import make_dev_certificate  # noqa: E402

# ----------------------------------------------------------------------------- server side


class NoopReviewer:
    """An engine that answers "allowed" with the uid: the cost of everything but the review."""

    def review(self, body: Any, raw: bytes | None = None) -> Any:
        from gpu_slicer.webhook.engine import ReviewResult, allowed

        return ReviewResult(allowed(str(body["request"]["uid"])), "skipped", "n/a")


def bench_app() -> Any:
    """WSGI app for gunicorn: the real webhook, and under ``/noop`` the same app with a no-op
    engine (``POST /noop/mutate-pods``)."""
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    from gpu_slicer.webhook.app import create_app
    from gpu_slicer.webhook.metrics import Metrics
    from gpu_slicer.webhook.server import Runtime

    real = create_app()
    noop = create_app(runtime=Runtime(reviewer=NoopReviewer(), metrics=Metrics()))
    return DispatcherMiddleware(real, {"/noop": noop})


# ----------------------------------------------------------------------------- requests


def review(pod: dict[str, Any], uid: str) -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "ml",
                "operation": "CREATE",
                "userInfo": {
                    "username": "system:serviceaccount:kube-system:replicaset-controller",
                    "groups": ["system:serviceaccounts", "system:authenticated"],
                },
                "object": pod,
                "oldObject": None,
                "dryRun": False,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
            },
        }
    ).encode()


def deployment_pod(resources: dict[str, Any]) -> dict[str, Any]:
    """A realistic Deployment pod: labels, owner, env, probes, volumes, a sidecar."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "trainer-6f8d9c7b5-",
            "namespace": "ml",
            "labels": {"app": "trainer", "pod-template-hash": "6f8d9c7b5", "team": "research"},
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "9090"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "trainer-6f8d9c7b5",
                    "uid": "5f1b-4c2d",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "serviceAccountName": "trainer",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/ml/train:2.4.1",
                    "args": ["--epochs", "10", "--data", "/data"],
                    "env": [{"name": f"VAR_{i}", "value": f"value-{i}"} for i in range(12)],
                    "ports": [{"containerPort": 9090, "name": "metrics"}],
                    "resources": resources,
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 9090}},
                },
                {
                    "name": "log-shipper",
                    "image": "registry.example/ops/shipper:1.3",
                    "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}},
                },
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
        },
    }


CONVERTED = deployment_pod(
    {"limits": {"cpu": "4", "memory": "32Gi", "nvidia.com/mig-1g.10gb": "1"}}
)
PLAIN = deployment_pod({"limits": {"cpu": "4", "memory": "32Gi"}})


_BUILD_IDS = itertools.count()


def unique_converted(_index: int) -> dict[str, Any]:
    """CONVERTED with a different annotation each time, across rounds too: no two pods alike,
    so the memo never answers (numbering by the round's index repeated the same pods in every
    round, and the memo answered part of them)."""
    pod: dict[str, Any] = json.loads(json.dumps(CONVERTED))
    pod["metadata"]["annotations"]["build-id"] = str(next(_BUILD_IDS))
    return pod


def unique_shape(index: int) -> dict[str, Any]:
    """A different pod whose GPU shape is new too: its converted container's name differs, so
    neither the memo nor the per-shape claim answers."""
    pod = unique_converted(index)
    pod["spec"]["containers"][0]["name"] = f"main-{next(_BUILD_IDS)}"
    return pod


# ----------------------------------------------------------------------------- clients


@dataclass
class Figures:
    label: str
    count: int
    seconds: float
    latencies: list[float]
    errors: int
    server_cpu_s: float = 0.0

    @property
    def cpu_ms_per_request(self) -> float:
        return self.server_cpu_s / self.count * 1000 if self.count else float("nan")

    @property
    def rps(self) -> float:
        return self.count / self.seconds if self.seconds else 0.0

    def pct(self, p: float) -> float:
        ordered = sorted(self.latencies)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


class Client:
    def __init__(self, port: int, context: ssl.SSLContext) -> None:
        self.conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)

    def post(self, path: str, body: bytes) -> int:
        self.conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        reply = self.conn.getresponse()
        reply.read()
        return reply.status

    def close(self) -> None:
        self.conn.close()


PodSource = dict[str, Any] | Callable[[int], dict[str, Any]]


def saturate(
    label: str,
    port: int,
    context: ssl.SSLContext,
    path: str,
    pod: PodSource,
    total: int,
    clients: int,
) -> Figures:
    """``total`` requests from ``clients`` threads, each as fast as its connection allows."""
    per_client = total // clients
    bodies = [
        [
            review(pod(index * per_client + i) if callable(pod) else pod, f"{label}-{index}-{i}")
            for i in range(per_client)
        ]
        for index in range(clients)
    ]
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    barrier = threading.Barrier(clients + 1)

    def run(index: int) -> None:
        client = Client(port, context)
        client.post(path, bodies[index][0])  # handshake outside the measurement
        barrier.wait()
        for body in bodies[index]:
            start = time.perf_counter()
            status = client.post(path, body)
            latencies[index].append(time.perf_counter() - start)
            if status != 200:
                errors[index] += 1
        client.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    flat = [x for chunk in latencies for x in chunk]
    return Figures(label, len(flat), seconds, flat, sum(errors))


def paced(
    label: str,
    port: int,
    context: ssl.SSLContext,
    path: str,
    pod: dict[str, Any],
    total: int,
    rate: float,
    clients: int = 2,
) -> Figures:
    """Open loop: request i is due at ``i / rate``; latency counts from when it was due, so a
    server that falls behind shows it in the tail instead of slowing the client down."""
    latencies: list[float] = []
    lock = threading.Lock()
    errors = [0]
    start_at = time.perf_counter() + 0.2

    def run(index: int) -> None:
        client = Client(port, context)
        client.post(path, review(pod, "warm"))
        for i in range(index, total, clients):
            due = start_at + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            try:
                status = client.post(path, review(pod, f"{label}-{i}"))
            except (OSError, http.client.HTTPException):
                status = 0  # a failed admission: counted, and the next one reconnects
                client.close()
                client = Client(port, context)
            elapsed = time.perf_counter() - due
            with lock:
                latencies.append(elapsed)
                if status != 200:
                    errors[0] += 1
        client.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start_at
    return Figures(label, len(latencies), seconds, latencies, errors[0])


# ----------------------------------------------------------------------------- server CPU


def process_stats(master: int) -> dict[int, list[str]]:
    """/proc/<pid>/stat fields (after the name) of ``master`` and its children: gunicorn's master
    and workers (Linux; empty elsewhere)."""
    found: dict[int, list[str]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(entry) == master or int(fields[1]) == master:
            found[int(entry)] = fields
    return found


def server_cpu_seconds(master: int) -> float:
    """User + system CPU of gunicorn's master and workers, from /proc (Linux; 0 elsewhere).

    Unlike throughput, CPU time per request hardly moves when other processes load the machine,
    so its ratios are the steadier figure on a shared host.
    """
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    stats = process_stats(master).values()
    return sum(int(fields[11]) + int(fields[12]) for fields in stats) / ticks


# ----------------------------------------------------------------------------- main


def _start_server(tmp: Path, workers: int) -> tuple[subprocess.Popen[bytes], int, Path]:
    cert, key = make_dev_certificate(tmp, ["127.0.0.1"])
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_SLICER_")}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    settings = ServerConfig(
        dev=True,
        bind=f"127.0.0.1:{port}",
        tls_cert=str(cert),
        tls_key=str(key),
        workers=workers,
        runtime_dir=str(tmp),
        log_level="WARNING",
    )
    env.update(settings.to_env())
    env["PYTHONPATH"] = str(ROOT)
    log = open(tmp / "gunicorn.log", "wb")  # noqa: SIM115 - lives as long as the server
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "-c",
            str(ROOT / "webhook" / "gunicorn.conf.py"),
            "bench.bench_webhook:bench_app()",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    context = ssl.create_default_context(cafile=str(cert))
    deadline = time.monotonic() + 30
    while True:
        try:
            client = Client(port, context)
            client.conn.request("GET", "/readyz")
            if client.conn.getresponse().status == 200:
                client.close()
                return process, port, cert
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("gunicorn did not start:\n" + (tmp / "gunicorn.log").read_text())
        time.sleep(0.1)


def _combine(parts: list[Figures]) -> Figures:
    return Figures(
        parts[0].label,
        sum(p.count for p in parts),
        sum(p.seconds for p in parts),
        [x for p in parts for x in p.latencies],
        sum(p.errors for p in parts),
        sum(p.server_cpu_s for p in parts),
    )


def _row(f: Figures) -> str:
    cpu = f"{f.cpu_ms_per_request:>8.3f}" if f.server_cpu_s else f"{'':>8}"
    return (
        f"{f.label:<30} {f.count:>7} {f.rps:>9.0f} {f.pct(50) * 1000:>8.2f} "
        f"{f.pct(99) * 1000:>8.2f} {cpu} {f.errors:>6}"
    )


def _stall(port: int, cafile: str, kind: int, delay: float, opened: Any, refused: Any) -> None:
    """One stalled connection, reopened as soon as the server closes it (in the attacker's
    process: its threads block on recv, so they cost the measuring client nothing). The first
    open waits ``delay``: staggered, the reopenings spread out instead of arriving together."""
    context = ssl.create_default_context(cafile=cafile)
    time.sleep(delay)
    while True:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=60)
            if kind >= 1:
                sock = context.wrap_socket(sock, server_hostname="127.0.0.1")
            if kind == 2:
                sock.sendall(
                    b"POST /mutate-pods HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Type: application/json\r\nContent-Length: 100000\r\n"
                    b'\r\n{"apiVersion": "admission.k8s.io/v1", '
                )
        except OSError:
            with refused.get_lock():
                refused.value += 1
            time.sleep(0.1)
            continue
        with opened.get_lock():
            opened.value += 1
        try:
            while sock.recv(4096):
                pass  # closed by the server's read deadline: reopen
        except OSError:
            pass
        finally:
            sock.close()


def _attacker(port: int, cafile: str, count: int, opened: Any, refused: Any) -> None:
    spread_s = 3.0  # the server's default read deadline
    threads = [
        threading.Thread(
            target=_stall,
            daemon=True,
            args=(port, cafile, i % 3, i * spread_s / count, opened, refused),
        )
        for i in range(count)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


class Stalling:
    """``count`` stalled connections held open by another process, each reopened as soon as the
    server closes it (an attacker that keeps trying). Kinds rotate: idle after TCP connect, idle
    after the TLS handshake, headers announcing a body and only part of it."""

    def __init__(self, port: int, cafile: Path, count: int) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self._opened = context.Value("i", 0)
        self._refused = context.Value("i", 0)
        self._process = context.Process(
            target=_attacker,
            args=(port, str(cafile), count, self._opened, self._refused),
            daemon=True,
        )
        self.opened = self.refused = 0

    def __enter__(self) -> Stalling:
        self._process.start()
        time.sleep(4.0)  # let them all connect before the measurement
        return self

    def __exit__(self, *_exc: object) -> None:
        self.opened, self.refused = self._opened.value, self._refused.value
        self._process.terminate()
        self._process.join(timeout=10)


def _spread(values: list[float]) -> str:
    return f"min {min(values):.2f}  median {statistics.median(values):.2f}  max {max(values):.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000, help="per kind, saturating")
    parser.add_argument("--rounds", type=int, default=8, help="interleaved rounds per kind")
    parser.add_argument("--clients", type=int, default=4, help="client threads (keep-alive)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=200.0, help="paced requests/s for (a)")
    parser.add_argument("--paced-requests", type=int, default=3000, help="per paced run")
    parser.add_argument(
        "--stalled",
        type=int,
        default=256,
        help="stalled connections held open during the second paced run",
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-webhook-") as folder:
        process, port, cert = _start_server(Path(folder), args.workers)
        context = ssl.create_default_context(cafile=str(cert))
        try:
            warm = max(200, args.requests // 10)
            for path, pod in (
                ("/mutate-pods", CONVERTED),
                ("/mutate-pods", PLAIN),
                ("/noop/mutate-pods", CONVERTED),
            ):
                saturate("warm-up", port, context, path, pod, warm, args.clients)
            kinds: list[tuple[str, str, PodSource]] = [
                ("(a) converted pod", "/mutate-pods", CONVERTED),
                ("(a') converted, all different", "/mutate-pods", unique_converted),
                ("(a'') converted, new GPU shape", "/mutate-pods", unique_shape),
                ("(b) nothing to convert", "/mutate-pods", PLAIN),
                ("(c) no-op handler", "/noop/mutate-pods", CONVERTED),
            ]
            runs: dict[str, list[Figures]] = {label: [] for label, _, _ in kinds}
            # Interleaved rounds in rotating order: load from elsewhere on the machine then
            # falls on all kinds alike instead of skewing one of them.
            for round_index in range(args.rounds):
                shift = round_index % len(kinds)
                for label, path, source in kinds[shift:] + kinds[:shift]:
                    cpu_before = server_cpu_seconds(process.pid)
                    figures = saturate(
                        label,
                        port,
                        context,
                        path,
                        source,
                        args.requests // args.rounds,
                        args.clients,
                    )
                    figures.server_cpu_s = server_cpu_seconds(process.pid) - cpu_before
                    runs[label].append(figures)
            a, a2, a3, b, c = (_combine(runs[label]) for label, _, _ in kinds)
            baseline = runs[kinds[-1][0]]
            cost = {
                f"{label.split()[0]}/(c)": [
                    runs[label][i].cpu_ms_per_request / baseline[i].cpu_ms_per_request
                    for i in range(args.rounds)
                ]
                for label, _, _ in kinds[:-1]
            }
            p = paced(
                f"(a) paced {args.rate:.0f}/s",
                port,
                context,
                "/mutate-pods",
                CONVERTED,
                args.paced_requests,
                args.rate,
            )
            with Stalling(port, cert, args.stalled) as stalling:
                ps = paced(
                    f"(a) paced, {args.stalled} stalled",
                    port,
                    context,
                    "/mutate-pods",
                    CONVERTED,
                    args.paced_requests,
                    args.rate,
                )
                time.sleep(0.5)
        finally:
            process.terminate()
            process.wait(timeout=30)

    overrides = os.environ.get("GUNICORN_CMD_ARGS")  # e.g. "--worker-class gthread --threads 4"
    server = f"gunicorn {overrides}" if overrides else "gunicorn + webhook.worker (gevent)"
    print(
        f"{server}, {args.workers} workers, TLS on "
        f"loopback; {args.clients} keep-alive client threads; {os.cpu_count()} CPUs shared by "
        f"both; {args.rounds} rounds of {args.requests // args.rounds} requests per kind"
    )
    print(
        f"{'kind':<30} {'requests':>7} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'cpu ms':>8} {'errors':>6}"
    )
    for figures in (a, a2, a3, b, c, p, ps):
        print(_row(figures))
    print(
        f"throughput (a)/(c) = {a.rps / c.rps:.2f}   (a')/(c) = {a2.rps / c.rps:.2f}   "
        f"(a'')/(c) = {a3.rps / c.rps:.2f}   (b)/(c) = {b.rps / c.rps:.2f}"
    )
    if all(all(x == x for x in values) for values in cost.values()):  # no NaN: /proc was read
        print("server CPU per request, cost over rounds (goal for (a)/(c): <= 1.25):")
        for name, values in cost.items():
            print(f"  {name:<10} {_spread(values)}")
    print(
        f"p99 of (a) at a paced {args.rate:.0f} requests/s: {p.pct(99) * 1000:.2f} ms "
        f"(achieved {p.rps:.0f} requests/s, {p.errors} failed)"
    )
    print(
        f"p99 of (a) at a paced {args.rate:.0f} requests/s with {args.stalled} stalled "
        f"connections held open: {ps.pct(99) * 1000:.2f} ms ({ps.errors} failed; the attacker "
        f"opened {stalling.opened} connections, {stalling.refused} refused)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
