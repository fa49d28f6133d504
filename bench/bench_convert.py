"""How long ``gpu-slicer convert`` takes, and how much memory, on big inputs (issue 33, item 5).

Two real-shaped inputs, generated into a temporary folder:

  manifest  one multi-document file of ``--mb`` MB (default 50): Deployments, StatefulSets and
            Jobs (one in ``--gpu-every``, default 10, asks for ``nvidia.com/gpu`` or a MIG
            profile, a few by annotation), each with several containers, probes, env and
            volumes; ConfigMaps whose data is a large shell script and a JSON blob (block
            scalars); CustomResourceDefinitions with an OpenAPI schema; Services.
  tree      ``--docs`` small documents (default 10,000; about 0.8 KB each) in files of
            ``--per-file`` (default 20) across folders: the same kinds and share of GPU
            requests, one container per workload, small ConfigMaps and CRDs.

Each is converted in a child process (``python -m cli.main convert``: the file, the same file
on standard input, the folder printed to standard output), and the child's wall time and peak
RSS (``os.wait4``'s resource usage of that child) are printed. The baseline is
a child that only reads the same text with the same bounded YAML reader
(``kube.documents.parse_all``), so the ratio stays meaningful on any machine. Prints figures
only (no pass/fail on time); the issue's goals are printed beside them.

    python bench/bench_convert.py [--mb 50] [--docs 10000] [--only manifest|tree]
                                  [--keep DIR] [--profile manifest|tree]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GPU_ASKS = ("nvidia.com/gpu: 1", "nvidia.com/mig-1g.10gb: 1", "nvidia.com/gpu: 2", None)
"""What a GPU workload asks for, in turn (None: the gpu-memory annotation)."""


def _container(name: str, index: int, gpu: str | None) -> str:
    limits = f"\n              {gpu}" if gpu else ""
    return f"""\
        - name: {name}
          image: registry.example.com/team/{name}:v1.{index % 40}.3
          imagePullPolicy: IfNotPresent
          args: ["--port=8080", "--log-level=info", "--workers={index % 8 + 1}"]
          env:
            - name: MODEL_PATH
              value: /models/{name}
            - name: POD_NAME
              valueFrom:
                fieldRef: {{fieldPath: metadata.name}}
            - name: REPLICA
              value: "{index % 5}"
          ports:
            - containerPort: 8080
              name: http
          readinessProbe:
            httpGet: {{path: /healthz, port: http}}
            periodSeconds: 10
          resources:
            requests:
              cpu: "{index % 4 + 1}"
              memory: {index % 16 + 1}Gi
            limits:
              memory: {index % 16 + 1}Gi{limits}
          volumeMounts:
            - name: models
              mountPath: /models
              readOnly: true
"""


def _pod_spec(name: str, index: int, gpu: str | None, containers: int) -> str:
    body = "".join(
        _container(f"{name}-c{c}", index + c, gpu if c == 0 else None) for c in range(containers)
    )
    return f"""\
      serviceAccountName: {name}
      nodeSelector:
        kubernetes.io/os: linux
      tolerations:
        - key: dedicated
          operator: Equal
          value: ml
          effect: NoSchedule
      containers:
{body}      volumes:
        - name: models
          persistentVolumeClaim:
            claimName: models-{index % 7}
"""


def _workload(index: int, gpu_every: int, containers: int) -> str:
    name = f"app-{index}"
    kind = ("Deployment", "StatefulSet", "Job")[index % 3]
    wants_gpu = index % gpu_every == 0
    ask = GPU_ASKS[(index // gpu_every) % len(GPU_ASKS)] if wants_gpu else None
    annotation = "\n        gpu-slicer.io/gpu-memory: 12Gi" if wants_gpu and ask is None else ""
    head = "apps/v1" if kind != "Job" else "batch/v1"
    extra = (
        f"  replicas: {index % 3 + 1}\n  selector:\n    matchLabels:\n      app: {name}\n"
        if kind != "Job"
        else "  backoffLimit: 2\n"
    )
    if kind == "StatefulSet":
        extra += f"  serviceName: {name}\n"
    restart = "      restartPolicy: Never\n" if kind == "Job" else ""
    return f"""\
apiVersion: {head}
kind: {kind}
metadata:
  name: {name}
  namespace: team-{index % 5}
  labels:
    app: {name}
    app.kubernetes.io/part-of: platform
  annotations:
    example.com/owner: team-{index % 5}
spec:
{extra}  template:
    metadata:
      labels:
        app: {name}
      annotations:
        prometheus.io/scrape: "true"{annotation}
    spec:
{restart}{_pod_spec(name, index, ask, containers)}"""


def _configmap(index: int, kilobytes: int) -> str:
    script = "".join(
        f'    echo "step {i}: $(date) syncing shard {i % 97}" >> /var/log/sync.log\n'
        for i in range(kilobytes * 1024 // 64)
    )
    blob = json.dumps({f"key{i}": f"value-{i}" * 3 for i in range(kilobytes * 4)})
    return f"""\
apiVersion: v1
kind: ConfigMap
metadata:
  name: scripts-{index}
  namespace: team-{index % 5}
data:
  sync.sh: |
    #!/bin/sh
    set -eu
{script}  settings.json: '{blob}'
"""


def _crd(index: int, properties: int) -> str:
    props = "".join(
        f"""\
                field{i}:
                  type: string
                  description: Field {i} of the resource, as the operator reads it.
"""
        for i in range(properties)
    )
    return f"""\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets{index}.example.com
spec:
  group: example.com
  names:
    kind: Widget{index}
    plural: widgets{index}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
{props}"""


def _service(index: int) -> str:
    return f"""\
apiVersion: v1
kind: Service
metadata:
  name: app-{index}
  namespace: team-{index % 5}
spec:
  selector:
    app: app-{index}
  ports:
    - port: 80
      targetPort: http
"""


def documents(gpu_every: int, big: bool) -> Iterator[str]:
    """Documents in a repeating mix: workloads and services, now and then a ConfigMap (large
    when ``big``) and a CRD."""
    index = 0
    while True:
        yield _workload(index, gpu_every, 1 + index % 3 if big else 1)
        yield _service(index)
        if index % 10 == 5:
            yield _configmap(index, 200 if big else 2)
        if index % 50 == 7:
            yield _crd(index, 200 if big else 5)
        index += 1


def write_manifest(path: Path, megabytes: float, gpu_every: int) -> int:
    """The manifest file; the number of documents."""
    target = int(megabytes * 1024 * 1024)
    size = count = 0
    with path.open("w") as out:
        for doc in documents(gpu_every, big=True):
            text = ("---\n" if count else "") + doc
            out.write(text)
            size += len(text)
            count += 1
            if size >= target:
                return count
    return count


def write_tree(folder: Path, docs: int, per_file: int, gpu_every: int) -> int:
    """The tree of small documents; the number of files."""
    stream = documents(gpu_every, big=False)
    files = 0
    for start in range(0, docs, per_file):
        sub = folder / f"team-{files % 10}" / f"app-{files // 10}"
        sub.mkdir(parents=True, exist_ok=True)
        texts = [next(stream) for _ in range(min(per_file, docs - start))]
        (sub / "manifests.yaml").write_text("---\n".join(texts))
        files += 1
    return files


_BASELINE = """\
import sys
from gpu_slicer.kube import documents
for path in sys.argv[1:]:
    paths = [p for p in __import__("pathlib").Path(path).rglob("*.yaml")] if \
__import__("os").path.isdir(path) else [path]
    for p in paths:
        documents.parse_all(open(p, encoding="utf-8").read())
"""


def _child(args: list[str], stdin: Path | None = None) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in MB, exit code) of one child process (``os.wait4`` gives
    that child's own resource usage)."""
    with (
        stdin.open("rb") if stdin else open(os.devnull, "rb") as source,
        tempfile.TemporaryFile() as errors,
    ):
        started = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            stdin=source,
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
        child.returncode = code = os.waitstatus_to_exitcode(status)
        if code not in (0, 1):
            errors.seek(0)
            print(errors.read().decode()[-2000:], file=sys.stderr)
    return wall, usage.ru_maxrss / 1024, code


def _row(label: str, wall: float, rss: float, code: int, base: tuple[float, float]) -> None:
    print(
        f"  {label:<28} {wall:7.2f} s  {rss:7.0f} MB  exit {code}   "
        f"x{wall / base[0]:.2f} time, x{rss / base[1]:.2f} memory of the baseline"
    )


def run_manifest(folder: Path, args: argparse.Namespace) -> None:
    path = folder / "manifest.yaml"
    count = write_manifest(path, args.mb, args.gpu_every)
    size = path.stat().st_size / 1024 / 1024
    print(f"manifest: {size:.1f} MB, {count:,} documents (goal: under 30 s and 400 MB)")
    runs = {
        "convert FILE": (["-m", "gpu_slicer.cli.main", "convert", str(path)], None),
        "convert - (stdin)": (["-m", "gpu_slicer.cli.main", "convert", "-"], path),
    }
    figures = {label: _child(argv, stdin) for label, (argv, stdin) in runs.items()}
    base_wall, base_rss, _ = _child(["-c", _BASELINE, str(path)])
    print(f"  {'baseline: parse_all':<28} {base_wall:7.2f} s  {base_rss:7.0f} MB")
    for label, (wall, rss, code) in figures.items():
        _row(label, wall, rss, code, (base_wall, base_rss))


def run_tree(folder: Path, args: argparse.Namespace) -> None:
    tree = folder / "tree"
    files = write_tree(tree, args.docs, args.per_file, args.gpu_every)
    print(f"tree: {args.docs:,} documents in {files:,} files (goal: under 5 s)")
    wall, rss, code = _child(["-m", "gpu_slicer.cli.main", "convert", str(tree)])
    base_wall, base_rss, _ = _child(["-c", _BASELINE, str(tree)])
    print(f"  {'baseline: parse_all':<28} {base_wall:7.2f} s  {base_rss:7.0f} MB")
    _row("convert DIR", wall, rss, code, (base_wall, base_rss))


def profile(folder: Path, args: argparse.Namespace) -> None:
    """cProfile of ``convert`` in this process (stdout discarded): the top 25 by time."""
    from gpu_slicer.cli.main import main

    if args.profile == "manifest":
        target = folder / "manifest.yaml"
        write_manifest(target, args.mb, args.gpu_every)
    else:
        target = folder / "tree"
        write_tree(target, args.docs, args.per_file, args.gpu_every)
    profiler = cProfile.Profile()
    saved, sys.stdout = sys.stdout, io.StringIO()
    try:
        profiler.runcall(main, ["convert", str(target)])
    finally:
        sys.stdout = saved
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=50)
    parser.add_argument("--docs", type=int, default=10_000)
    parser.add_argument("--per-file", type=int, default=20)
    parser.add_argument("--gpu-every", type=int, default=10)
    parser.add_argument("--only", choices=["manifest", "tree"])
    parser.add_argument("--keep", metavar="DIR", help="generate into DIR and keep it")
    parser.add_argument("--profile", choices=["manifest", "tree"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.keep or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        if args.profile:
            profile(folder, args)
            return
        if args.only != "tree":
            run_manifest(folder, args)
        if args.only != "manifest":
            run_tree(folder, args)


if __name__ == "__main__":
    main()
