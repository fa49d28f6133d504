"""Admission throughput and latency of the webhook: gunicorn over TLS on loopback.

Three request kinds against the same server (same gunicorn.conf.py, TLS, Flask view, metrics):

  (a) a typical converted pod (a Deployment's pod asking for ``nvidia.com/mig-1g.10gb``); its
      replicas are identical, so after the first one the engine's translation memo answers,
  (a') the same pod made different each time (an annotation), so every request is translated,
  (b) a pod with nothing to convert (CPU and memory only),
  (c) a no-op handler: the same view with an engine that only echoes the uid: the ceiling.

Reports requests/s, p50 and p99 per kind, the ratios (a)/(c) and (b)/(c) of throughput, the
same ratios computed from the server's CPU time per request (steadier on a shared machine), and
p99 of (a) at a paced, open-loop 200 requests/s. Clients use keep-alive connections (http.client)
from a few threads; request counts are bounded; loopback only. Prints figures, never pass/fail:
client and server share this machine's CPUs, so compare the ratios rather than the absolutes.

    python bench/bench_webhook.py [--requests 3000] [--clients 4] [--workers 2] [--threads 4]
                                  [--rate 200] [--paced-requests 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import ssl
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

from webhook.config import ServerConfig  # noqa: E402
from webhook.server import make_dev_certificate  # noqa: E402

# ----------------------------------------------------------------------------- server side


class NoopReviewer:
    """An engine that answers "allowed" with the uid: the cost of everything but the review."""

    def review(self, body: Any) -> Any:
        from webhook.engine import ReviewResult, allowed

        return ReviewResult(allowed(str(body["request"]["uid"])), "skipped", "n/a")


def bench_app() -> Any:
    """WSGI app for gunicorn: the real webhook, and under ``/noop`` the same app with a no-op
    engine (``POST /noop/mutate-pods``)."""
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    from webhook.app import create_app
    from webhook.metrics import Metrics
    from webhook.server import Runtime

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
                "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                             "groups": ["system:serviceaccounts", "system:authenticated"]},
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
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                 "name": "trainer-6f8d9c7b5", "uid": "5f1b-4c2d",
                                 "controller": True, "blockOwnerDeletion": True}],
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
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                             "effect": "NoSchedule"}],
        },
    }


CONVERTED = deployment_pod(
    {"limits": {"cpu": "4", "memory": "32Gi", "nvidia.com/mig-1g.10gb": "1"}}
)
PLAIN = deployment_pod({"limits": {"cpu": "4", "memory": "32Gi"}})


def unique_converted(index: int) -> dict[str, Any]:
    """CONVERTED with a different annotation each time: no two pods alike (no memo hit)."""
    pod: dict[str, Any] = json.loads(json.dumps(CONVERTED))
    pod["metadata"]["annotations"]["build-id"] = str(index)
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


def saturate(label: str, port: int, context: ssl.SSLContext, path: str, pod: PodSource,
             total: int, clients: int) -> Figures:
    """``total`` requests from ``clients`` threads, each as fast as its connection allows."""
    per_client = total // clients
    bodies = [
        [review(pod(index * per_client + i) if callable(pod) else pod, f"{label}-{index}-{i}")
         for i in range(per_client)]
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


def paced(label: str, port: int, context: ssl.SSLContext, path: str, pod: dict[str, Any],
          total: int, rate: float, clients: int = 2) -> Figures:
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
            status = client.post(path, review(pod, f"{label}-{i}"))
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


def server_cpu_seconds(master: int) -> float:
    """User + system CPU of gunicorn's master and workers, from /proc (Linux; 0 elsewhere).

    Unlike throughput, CPU time per request hardly moves when other processes load the machine,
    so its ratios are the steadier figure on a shared host.
    """
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0.0
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        pid, ppid = int(entry), int(fields[1])
        if pid == master or ppid == master:
            total += int(fields[11]) + int(fields[12])
    return total / ticks


# ----------------------------------------------------------------------------- main


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_server(tmp: Path, workers: int, threads: int) -> tuple[subprocess.Popen[bytes], int,
                                                                   Path]:
    cert, key = make_dev_certificate(tmp, ["127.0.0.1"])
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_SLICER_")}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    settings = ServerConfig(
        dev=True, bind=f"127.0.0.1:{port}", tls_cert=str(cert), tls_key=str(key),
        workers=workers, threads=threads, runtime_dir=str(tmp), log_level="WARNING",
    )
    env.update(settings.to_env())
    env["PYTHONPATH"] = str(ROOT)
    log = open(tmp / "gunicorn.log", "wb")  # noqa: SIM115 - lives as long as the server
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "webhook" / "gunicorn.conf.py"),
         "bench.bench_webhook:bench_app()"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
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
    return (f"{f.label:<30} {f.count:>7} {f.rps:>9.0f} {f.pct(50) * 1000:>8.2f} "
            f"{f.pct(99) * 1000:>8.2f} {cpu} {f.errors:>6}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="per kind, saturating")
    parser.add_argument("--clients", type=int, default=4, help="client threads (keep-alive)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rate", type=float, default=200.0, help="paced requests/s for (a)")
    parser.add_argument("--paced-requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds per kind")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-webhook-") as folder:
        process, port, cert = _start_server(Path(folder), args.workers, args.threads)
        context = ssl.create_default_context(cafile=str(cert))
        try:
            warm = max(200, args.requests // 10)
            for path, pod in (("/mutate-pods", CONVERTED), ("/mutate-pods", PLAIN),
                              ("/noop/mutate-pods", CONVERTED)):
                saturate("warm-up", port, context, path, pod, warm, args.clients)
            kinds: list[tuple[str, str, PodSource]] = [
                ("(a) converted pod", "/mutate-pods", CONVERTED),
                ("(a') converted, all different", "/mutate-pods", unique_converted),
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
                    figures = saturate(label, port, context, path, source,
                                       args.requests // args.rounds, args.clients)
                    figures.server_cpu_s = server_cpu_seconds(process.pid) - cpu_before
                    runs[label].append(figures)
            a, a2, b, c = (_combine(runs[label]) for label, _, _ in kinds)
            p = paced(f"(a) paced {args.rate:.0f}/s", port, context, "/mutate-pods", CONVERTED,
                      args.paced_requests, args.rate)
        finally:
            process.terminate()
            process.wait(timeout=30)

    print(f"gunicorn gthread, {args.workers} workers x {args.threads} threads, TLS on loopback; "
          f"{args.clients} keep-alive client threads; {os.cpu_count()} CPUs shared by both")
    print(f"{'kind':<30} {'requests':>7} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'cpu ms':>8} {'errors':>6}")
    for figures in (a, a2, b, c, p):
        print(_row(figures))
    print(f"throughput (a)/(c) = {a.rps / c.rps:.2f}   (a')/(c) = {a2.rps / c.rps:.2f}   "
          f"(b)/(c) = {b.rps / c.rps:.2f}")
    if a.server_cpu_s and a2.server_cpu_s and b.server_cpu_s and c.server_cpu_s:
        base = c.cpu_ms_per_request
        print(f"server capacity from CPU per request: (a)/(c) = "
              f"{base / a.cpu_ms_per_request:.2f}   (a')/(c) = "
              f"{base / a2.cpu_ms_per_request:.2f}   (b)/(c) = "
              f"{base / b.cpu_ms_per_request:.2f}")
    print(f"p99 of (a) at a paced {args.rate:.0f} requests/s: {p.pct(99) * 1000:.2f} ms "
          f"(achieved {p.rps:.0f} requests/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
