"""Worker memory of the webhook under large, all-different pods: gunicorn over TLS on loopback.

Sends ``--pods`` distinct converted pods of about ``--size-mb`` MB each (a Deployment pod asking
for ``nvidia.com/mig-1g.10gb`` with a large annotation that differs every time, so no two are
alike and each one is translated) from ``--clients`` keep-alive connections to one gunicorn
worker, and prints that worker's resident memory (VmRSS, from /proc) at start, its peak
(sampled every 50 ms) and at the end. Before the translation memo was bounded by bytes, 300
such pods took a worker to about 680 MiB; the goal is under 150 MiB after 1,000.

    python bench/bench_webhook_memory.py [--pods 1000] [--size-mb 3.0] [--clients 2]
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_webhook import (  # noqa: E402
    CONVERTED,
    Client,
    _start_server,
    process_stats,
    review,
)


def worker_rss_mib(master: int) -> float:
    """The largest resident set among the master's children (the workers), in MiB."""
    page = os.sysconf("SC_PAGE_SIZE")
    pages = [int(fields[21]) for pid, fields in process_stats(master).items() if pid != master]
    return max(pages, default=0) * page / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--size-mb", type=float, default=3.0, help="each pod's size (< 3 MiB)")
    parser.add_argument("--clients", type=int, default=2)
    args = parser.parse_args()
    filler = "x" * int(args.size_mb * 1_000_000 - 4_000)

    with tempfile.TemporaryDirectory(prefix="bench-webhook-memory-") as folder:
        process, port, cert = _start_server(Path(folder), workers=1)
        context = ssl.create_default_context(cafile=str(cert))
        peak = [0.0]
        done = threading.Event()
        failures = [0]

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], worker_rss_mib(process.pid))
                time.sleep(0.05)

        def send(index: int) -> None:
            client = Client(port, context)
            for i in range(index, args.pods, args.clients):
                pod = json.loads(json.dumps(CONVERTED))
                pod["metadata"]["annotations"]["blob"] = f"{i}-{filler}"
                if client.post("/mutate-pods", review(pod, f"memory-{i}")) != 200:
                    failures[0] += 1
            client.close()

        try:
            start_rss = worker_rss_mib(process.pid)
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            started = time.perf_counter()
            senders = [threading.Thread(target=send, args=(i,)) for i in range(args.clients)]
            for thread in senders:
                thread.start()
            for thread in senders:
                thread.join()
            seconds = time.perf_counter() - started
            time.sleep(0.5)
            end_rss = worker_rss_mib(process.pid)
            done.set()
        finally:
            process.terminate()
            process.wait(timeout=30)

    print(
        f"{args.pods} distinct pods of {args.size_mb} MB from {args.clients} clients to one "
        f"worker in {seconds:.1f} s ({failures[0]} failed)"
    )
    print(
        f"worker RSS: start {start_rss:.0f} MiB, peak {peak[0]:.0f} MiB, end {end_rss:.0f} MiB "
        f"(goal: under 150 MiB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
