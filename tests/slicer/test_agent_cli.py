"""`gpu-slicer agent run`: flags and their environment twins, bad input, and a real process that
serves a kubelet-like client over its sockets and exits cleanly on SIGTERM."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cli.main import build_parser, main
from slicer.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_defaults_are_the_kubelets_directories(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("GPU_SLICER_") or name == "NODE_NAME":
            monkeypatch.delenv(name)
    args = build_parser().parse_args(["agent", "run", "--node", "n1"])
    assert args.plugins_dir == Path("/var/lib/kubelet/plugins")
    assert args.registry_dir == Path("/var/lib/kubelet/plugins_registry")
    assert args.cdi_dir == Path("/var/run/cdi")
    assert args.checkpoint_dir == Path("/var/lib/gpu-slicer")
    assert args.backend == "nvml"
    assert (args.republish_interval, args.reprobe_interval) == (10.0, 600.0)


def test_every_flag_has_an_environment_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "NODE_NAME": "from-downward-api", "GPU_SLICER_BACKEND": "simulated",
        "GPU_SLICER_SIMULATE_GPUS": "A100-80GB:1", "GPU_SLICER_CHECKPOINT_DIR": "/c",
        "GPU_SLICER_CDI_DIR": "/d", "GPU_SLICER_PLUGINS_DIR": "/p",
        "GPU_SLICER_REGISTRY_DIR": "/r", "GPU_SLICER_METRICS_BIND": "127.0.0.1:1",
        "GPU_SLICER_RECONCILE_INTERVAL": "7", "GPU_SLICER_KUBECONFIG": "/k",
        "GPU_SLICER_KUBE": "memory", "GPU_SLICER_REPUBLISH_INTERVAL": "4",
        "GPU_SLICER_REPROBE_INTERVAL": "0",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["agent", "run"])
    assert (args.node, args.backend, args.simulate_gpus) == (
        "from-downward-api", "simulated", "A100-80GB:1")
    assert (args.checkpoint_dir, args.cdi_dir, args.plugins_dir, args.registry_dir) == (
        Path("/c"), Path("/d"), Path("/p"), Path("/r"))
    assert (args.metrics_bind, args.reconcile_interval, args.kubeconfig, args.kube) == (
        "127.0.0.1:1", 7.0, "/k", "memory")
    assert (args.republish_interval, args.reprobe_interval) == (4.0, 0.0)
    monkeypatch.setenv("GPU_SLICER_NODE", "explicit")
    assert build_parser().parse_args(["agent", "run"]).node == "explicit"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--node is required"),
        (["--node", "n", "--simulate-gpus", "Z100:2"], "--simulate-gpus"),
        (["--node", "n", "--metrics-bind", "nowhere"], "--metrics-bind"),
        (["--node", "n", "--reconcile-interval", "0"], "--reconcile-interval"),
        (["--node", "n", "--plugins-dir", "/tmp/" + "x" * 120], "unix socket path"),
        (["--node", "n", "--republish-interval", "0"], "--republish-interval"),
        (["--node", "n", "--republish-interval", "soon"], "--republish-interval"),
        (["--node", "n", "--reprobe-interval", "-1"], "--reprobe-interval"),
    ],
    ids=["no-node", "bad-gpu-spec", "bad-bind", "bad-interval", "long-socket-path",
         "zero-republish-interval", "text-republish-interval", "negative-reprobe-interval"],
)
def test_bad_input_exits_2_naming_the_problem(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], short_dir: Path,
) -> None:
    monkeypatch.delenv("GPU_SLICER_NODE", raising=False)
    monkeypatch.delenv("NODE_NAME", raising=False)
    base = ["agent", "run", "--backend", "simulated", "--kube", "memory", "--metrics-bind", "",
            "--checkpoint-dir", str(short_dir / "c"), "--cdi-dir", str(short_dir / "d"),
            "--registry-dir", str(short_dir / "r"), "--plugins-dir", str(short_dir / "p")]
    assert main([*base, *argv]) == 2
    assert message in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_agent_process_serves_the_kubelet_and_stops_cleanly_on_sigterm(
    short_dir: Path,
) -> None:
    port = _free_port()
    registry, plugins = short_dir / "reg", short_dir / "plugins"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "agent", "run", "--node", "n1",
         "--backend", "simulated", "--simulate-gpus", "H100-80GB:1", "--kube", "memory",
         "--checkpoint-dir", str(short_dir / "ckpt"), "--cdi-dir", str(short_dir / "cdi"),
         "--plugins-dir", str(plugins), "--registry-dir", str(registry),
         "--metrics-bind", f"127.0.0.1:{port}", "--reconcile-interval", "0.5"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    reg_sock = registry / "gpu-slicer.io-reg.sock"
    try:
        deadline = time.monotonic() + 60
        while not reg_sock.exists():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the agent never created its socket"
            time.sleep(0.1)
        with grpc.insecure_channel(f"unix://{reg_sock}") as channel:
            registration = pluginregistration_pb2_grpc.RegistrationStub(  # type: ignore[no-untyped-call]
                channel)
            info = registration.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=20)
        assert info.endpoint == str(plugins / "gpu-slicer.io" / "dra.sock")
        with grpc.insecure_channel(f"unix://{info.endpoint}") as channel:
            dra = dra_v1_pb2_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
            response = dra.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(claims=[
                    dra_v1_pb2.Claim(namespace="ml", uid="u-1", name="nothing")]), timeout=20)
        assert "does not exist" in response.claims["u-1"].error
        metrics = ""
        while "gpu_slicer_agent_free_memory_slices" not in metrics:
            assert time.monotonic() < deadline, metrics
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                metrics = r.read().decode()
            time.sleep(0.1)
        assert 'gpu_slicer_agent_free_memory_slices{gpu="0"} 8.0' in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert not reg_sock.exists()
    assert not (plugins / "gpu-slicer.io" / "dra.sock").exists()
