"""What ships is what runs: the package installed without extras into a fresh virtual environment
(``sandbox.install``), and each long-running command it ships started from there until it really
serves, then stopped cleanly:

* ``gpu-slicer webhook serve --dev``: ``/healthz`` answers over TLS;
* ``gpu-slicer agent run`` (simulated GPUs, in-memory API): its sockets appear, the kubelet's
  calls (registration, the resource-health stream) answer, ``/metrics`` answers;
* ``gpu-slicer certs ensure --interval``: the serving Secret appears in the (stub) apiserver;
* ``gpu-slicer-krm``, the kustomize function, answers a ResourceList (shipped, not long-running).

``sandbox up`` is left out here: it needs the control plane built with Go, and the end-to-end tier
runs it (with its webhook and agents from this same install). The declared dependencies are
installed once from the package index into the cache; without the index this module is skipped,
except under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from gpu_slicer.sandbox.errors import BuildError
from gpu_slicer.sandbox.install import install
from gpu_slicer.sandbox.process import free_port
from gpu_slicer.slicer.proto import (
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from tests.support.agent_fixtures import simulated_agent_args
from tests.support.kube_stub_apiserver import StubApiServer

PACKAGES = ("core", "cli", "kube", "slicer", "webhook", "certs", "sim", "status", "plan")


@pytest.fixture(scope="module")
def shipped() -> Iterator[Path]:
    """The fresh install; its ``bin/gpu-slicer`` is the command."""
    folder = Path(tempfile.mkdtemp(prefix="gs-inst-", dir="/tmp"))  # short: socket paths
    try:
        install(folder / "venv", progress=lambda m: print(m, file=sys.__stderr__, flush=True))
    except BuildError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"cannot install the package without extras: {exc}")
        pytest.skip(f"cannot install the package without extras: {exc}")
    yield folder
    subprocess.run(["rm", "-rf", str(folder)], check=False)


def _env(home: Path) -> dict[str, str]:
    """No test settings and no way back into the tree: run from an empty folder."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GPU_SLICER_") and k not in ("PYTHONPATH", "KUBECONFIG")
    }
    env["TMPDIR"] = str(home)
    return env


def _start(shipped: Path, *args: str) -> subprocess.Popen[str]:
    work = shipped / "work"
    work.mkdir(exist_ok=True)
    return subprocess.Popen(
        [str(shipped / "venv" / "bin" / "gpu-slicer"), *args],
        cwd=work,
        env=_env(work),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _until(proc: subprocess.Popen[str], ready: Any, what: str, limit_s: float = 90) -> Any:
    """Poll ``ready`` until it answers (a correctness wait; a process that exits fails at once)."""
    deadline = time.monotonic() + limit_s
    while True:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"{what}: the command exited {proc.returncode}:\n{err[-3000:]}")
        try:
            answer = ready()
        except (OSError, grpc.RpcError):
            answer = None
        if answer:
            return answer
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{what}: not up after {limit_s:.0f} s:\n{proc.communicate()[1][-3000:]}")
        time.sleep(0.2)


def _stops_cleanly(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    return err


def test_every_module_of_the_package_imports_from_the_install(shipped: Path) -> None:
    # One import namespace, every package under it, and no development tooling: the sandbox
    # (its Go sources with it) is a checkout's only.
    script = (
        "import importlib, importlib.util, pkgutil, sys\n"
        "import gpu_slicer\n"
        "found = sorted(m.name for m in pkgutil.iter_modules(gpu_slicer.__path__))\n"
        f"assert found == sorted({PACKAGES!r}), found\n"
        "assert importlib.util.find_spec('gpu_slicer.sandbox') is None\n"
        f"generic = [n for n in {PACKAGES!r} + ('sandbox',) if importlib.util.find_spec(n)]\n"
        "assert not generic, generic\n"
        f"for name in {PACKAGES!r}:\n"
        "    package = importlib.import_module('gpu_slicer.' + name)\n"
        "    assert '/site-packages/gpu_slicer/' in package.__file__, package.__file__\n"
        "    for module in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        importlib.import_module(module.name)\n"
    )
    done = subprocess.run(
        [str(shipped / "venv" / "bin" / "python"), "-c", script],
        cwd=shipped,
        env=_env(shipped),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def test_the_sandbox_command_says_it_needs_a_checkout(shipped: Path) -> None:
    listed = subprocess.run(
        [str(shipped / "venv" / "bin" / "gpu-slicer"), "--help"],
        env=_env(shipped),
        capture_output=True,
        text=True,
    )
    assert listed.returncode == 0, listed.stderr
    assert "sandbox" in listed.stdout
    done = subprocess.run(
        [str(shipped / "venv" / "bin" / "gpu-slicer"), "sandbox", "up", "--node", "a=A100-80GB:1"],
        env=_env(shipped),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "source checkout" in done.stderr, done.stderr


def test_webhook_serve_answers_healthz_and_stops(shipped: Path) -> None:
    port = free_port()
    proc = _start(shipped, "webhook", "serve", "--dev", "--bind", f"127.0.0.1:{port}")
    unverified = ssl.create_default_context()
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE  # --dev serves a self-signed certificate

    def healthz() -> bool:
        url = f"https://127.0.0.1:{port}/healthz"
        with urllib.request.urlopen(url, timeout=5, context=unverified) as response:
            return bool(response.status == 200)

    _until(proc, healthz, "webhook serve")
    _stops_cleanly(proc)


def test_agent_run_serves_the_kubelet_and_stops(shipped: Path) -> None:
    root = shipped / "agent"
    port = free_port()
    proc = _start(
        shipped,
        *simulated_agent_args(root),
        "--metrics-bind",
        f"127.0.0.1:{port}",
    )
    registration = root / "reg" / "z.gpu-slicer.io-reg.sock"

    def info() -> Any:
        with grpc.insecure_channel(f"unix://{registration}") as channel:
            stub = pluginregistration_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            return stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=5)

    endpoint = _until(proc, info, "agent run: registration socket").endpoint

    def health() -> Any:
        with grpc.insecure_channel(f"unix://{endpoint}") as channel:
            stub = dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(channel)  # type: ignore[no-untyped-call]
            stream = stub.NodeWatchResources(
                dra_health_v1alpha1_pb2.NodeWatchResourcesRequest(), timeout=10
            )
            first = next(stream)
            stream.cancel()
            return [d.device.device_name for d in first.devices]

    assert "gpu-0" in _until(proc, health, "agent run: published devices in the health stream")

    def metrics() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return "gpu_slicer_agent" in response.read().decode()

    _until(proc, metrics, "agent run: /metrics")
    _stops_cleanly(proc)
    assert not registration.exists() and not Path(endpoint).exists()


def test_certs_ensure_keeps_the_secret_and_stops(shipped: Path) -> None:
    stub = StubApiServer()
    try:
        kubeconfig = shipped / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "stub", "cluster": {"server": stub.url}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "c", "context": {"cluster": "stub", "user": "u"}}],
                    "current-context": "c",
                }
            )
        )
        proc = _start(
            shipped,
            "certs",
            "ensure",
            "--namespace",
            "gpu-slicer",
            "--secret",
            "gpu-slicer-webhook-tls",
            "--webhook-config",
            "gpu-slicer",
            "--kubeconfig",
            str(kubeconfig),
            "--interval",
            "60",
        )

        def secret() -> bool:
            names = {s["metadata"]["name"] for s in stub.backend.objects("v1", "Secret")}
            return "gpu-slicer-webhook-tls" in names

        _until(proc, secret, "certs ensure: the serving Secret")
        _stops_cleanly(proc)
    finally:
        stub.close()
    assert stub.errors == []


def test_the_krm_function_answers_a_resource_list(shipped: Path) -> None:
    resource_list = {"apiVersion": "config.kubernetes.io/v1", "kind": "ResourceList", "items": []}
    done = subprocess.run(
        [str(shipped / "venv" / "bin" / "gpu-slicer-krm")],
        input=json.dumps(resource_list),
        cwd=shipped,
        env=_env(shipped),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["kind"] == "ResourceList"


def test_the_cache_key_follows_the_declared_dependencies_only(tmp_path: Path) -> None:
    from gpu_slicer.sandbox.install import ROOT, dependency_key, requirements

    declared = requirements()
    assert "packaging>=23" in declared  # gunicorn's gevent worker imports it
    assert not any(r.startswith(("pytest", "grpcio-tools", "mypy")) for r in declared)
    pyproject = (ROOT / "pyproject.toml").read_text()
    edited = tmp_path / "pyproject.toml"
    edited.write_text(pyproject.replace('version = "0.2.0"', 'version = "9.9.9"'))
    assert dependency_key(requirements(edited)) == dependency_key(declared)
    edited.write_text(pyproject.replace('"pyyaml>=6",', '"pyyaml>=6",\n  "rich>=13",'))
    assert dependency_key(requirements(edited)) != dependency_key(declared)
