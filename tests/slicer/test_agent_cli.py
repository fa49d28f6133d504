"""`gpu-slicer agent run`: flags and their environment twins, bad input, and a real process that
serves a kubelet-like client over its sockets (preparing, watching device health while
`gpu-slicer agent simulate-event` hits its simulated GPU) and exits cleanly on SIGTERM."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gpu_slicer.cli.main import build_parser, main
from gpu_slicer.sandbox.process import free_port
from gpu_slicer.slicer.cli import agent_settings
from gpu_slicer.slicer.proto import (
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from tests.support.agent_fixtures import simulated_agent_args
from tests.support.previous_formats import checkpoint_from_the_future

ROOT = Path(__file__).resolve().parents[2]
TOOLKIT_SPEC = Path(__file__).resolve().parent / "data" / "nvidia-toolkit-cdi.yaml"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_defaults_are_the_kubelets_directories(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("GPU_SLICER_") or name == "NODE_NAME":
            monkeypatch.delenv(name)
    args = agent_settings(build_parser().parse_args(["agent", "run", "--node", "n1"]))
    assert args.plugins_dir == Path("/var/lib/kubelet/plugins")
    assert args.registry_dir == Path("/var/lib/kubelet/plugins_registry")
    assert args.cdi_dir == Path("/var/run/cdi")
    assert args.checkpoint_dir == Path("/var/lib/gpu-slicer")
    assert args.backend == "nvml"
    assert (args.republish_interval, args.reprobe_interval) == (10.0, 600.0)


def test_every_flag_has_an_environment_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "NODE_NAME": "from-downward-api",
        "GPU_SLICER_BACKEND": "simulated",
        "GPU_SLICER_SIMULATE_GPUS": "A100-80GB:1",
        "GPU_SLICER_CHECKPOINT_DIR": "/c",
        "GPU_SLICER_CDI_DIR": "/d",
        "GPU_SLICER_PLUGINS_DIR": "/p",
        "GPU_SLICER_REGISTRY_DIR": "/r",
        "GPU_SLICER_METRICS_BIND": "127.0.0.1:1",
        "GPU_SLICER_RECONCILE_INTERVAL": "7",
        "GPU_SLICER_KUBECONFIG": "/k",
        "GPU_SLICER_KUBE": "memory",
        "GPU_SLICER_REPUBLISH_INTERVAL": "4",
        "GPU_SLICER_REPROBE_INTERVAL": "0",
        "GPU_SLICER_TOOLKIT_CDI_SPEC": "/t.yaml",
        "GPU_SLICER_NVIDIA_CTK": "/usr/bin/nvidia-ctk",
        "GPU_SLICER_STATIC_LAYOUT": "/l.yaml",
        "GPU_SLICER_ADVERTISE": "static",
        "GPU_SLICER_PROFILES": "-*+me",
        "GPU_SLICER_ATTRIBUTES": "minimal",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = agent_settings(build_parser().parse_args(["agent", "run"]))
    assert (args.node, args.backend, args.simulate_gpus) == (
        "from-downward-api",
        "simulated",
        "A100-80GB:1",
    )
    assert (args.checkpoint_dir, args.cdi_dir, args.plugins_dir, args.registry_dir) == (
        Path("/c"),
        Path("/d"),
        Path("/p"),
        Path("/r"),
    )
    assert (args.metrics_bind, args.reconcile_interval, args.kubeconfig, args.kube) == (
        "127.0.0.1:1",
        7.0,
        "/k",
        "memory",
    )
    assert (args.republish_interval, args.reprobe_interval) == (4.0, 0.0)
    assert (args.toolkit_cdi_spec, args.nvidia_ctk, args.static_layout) == (
        Path("/t.yaml"),
        "/usr/bin/nvidia-ctk",
        Path("/l.yaml"),
    )
    assert (args.advertise, args.profiles, args.attributes) == ("static", "-*+me", "minimal")
    monkeypatch.setenv("GPU_SLICER_NODE", "explicit")
    assert agent_settings(build_parser().parse_args(["agent", "run"])).node == "explicit"
    flags = build_parser().parse_args(["agent", "run", "--node", "flag", "--kube", "cluster"])
    assert (agent_settings(flags).node, agent_settings(flags).kube) == ("flag", "cluster")


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
        (
            ["--node", "n", "--toolkit-cdi-spec", "/nonexistent/nvidia.yaml"],
            "--toolkit-cdi-spec: toolkit CDI spec /nonexistent/nvidia.yaml",
        ),
        (
            ["--node", "n", "--toolkit-cdi-spec", str(TOOLKIT_SPEC), "--nvidia-ctk", "nvidia-ctk"],
            "not both",
        ),
        (["--node", "n", "--static-layout", "/nonexistent/layout.yaml"], "--static-layout"),
        (["--node", "n", "--advertise", "counters"], "--advertise 'counters' is not one of"),
        (["--node", "n", "--attributes", "lean"], "--attributes 'lean' is not one of full"),
        (["--node", "n", "--profiles", "1g.10gbb"], "did you mean 1g.10gb"),
        (
            ["--node", "n", "--simulate-gpus", "A100-80GB:1", "--profiles", "1g.12gb"],
            "leaves no MIG profile on this node's A100-80GB GPUs",
        ),
    ],
    ids=[
        "no-node",
        "bad-gpu-spec",
        "bad-bind",
        "bad-interval",
        "long-socket-path",
        "zero-republish-interval",
        "text-republish-interval",
        "negative-reprobe-interval",
        "missing-toolkit-spec",
        "two-toolkit-sources",
        "missing-layout",
        "bad-advertise",
        "bad-attributes",
        "unknown-profile",
        "no-profile-of-the-model",
    ],
)
def test_bad_input_exits_2_naming_the_problem(
    argv: list[str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    short_dir: Path,
) -> None:
    monkeypatch.delenv("GPU_SLICER_NODE", raising=False)
    monkeypatch.delenv("NODE_NAME", raising=False)
    base = [
        "agent",
        "run",
        "--backend",
        "simulated",
        "--kube",
        "memory",
        "--metrics-bind",
        "",
        "--checkpoint-dir",
        str(short_dir / "c"),
        "--cdi-dir",
        str(short_dir / "d"),
        "--registry-dir",
        str(short_dir / "r"),
        "--plugins-dir",
        str(short_dir / "p"),
    ]
    assert main([*base, *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_checkpoint_of_a_newer_format_stops_the_agent_with_the_way_out(
    capsys: pytest.CaptureFixture[str], short_dir: Path
) -> None:
    (short_dir / "ckpt").mkdir()
    checkpoint = short_dir / "ckpt" / "checkpoint.json"
    checkpoint.write_bytes(checkpoint_from_the_future(4, writer="gpu-slicer 0.9.0"))
    before = checkpoint.read_bytes()
    assert main([*simulated_agent_args(short_dir), "--metrics-bind", ""]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpu-slicer agent run: cannot start: checkpoint ")
    assert "is format version 4, written by gpu-slicer 0.9.0" in err
    assert "docs/agent.md, section 'Checkpoint format versions'" in err
    assert checkpoint.read_bytes() == before
    assert not (short_dir / "plugins").exists()  # no socket was opened


def test_a_static_layout_that_does_not_fit_the_gpus_exits_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    short_dir: Path,
) -> None:
    layout = tmp_path / "layout.yaml"
    layout.write_text('default: ["3g.40gb@0", "4g.40gb@0"]\n')
    argv = [
        "agent",
        "run",
        "--node",
        "n",
        "--backend",
        "simulated",
        "--simulate-gpus",
        "A100-80GB:1",
        "--kube",
        "memory",
        "--metrics-bind",
        "",
        "--checkpoint-dir",
        str(short_dir / "c"),
        "--cdi-dir",
        str(short_dir / "d"),
        "--registry-dir",
        str(short_dir / "r"),
        "--plugins-dir",
        str(short_dir / "p"),
        "--static-layout",
        str(layout),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--static-layout" in err and "overlaps" in err


def test_without_a_toolkit_spec_the_agent_says_pods_get_no_cuda_libraries(
    short_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from gpu_slicer.kube.memory import InMemoryKubeApi
    from gpu_slicer.slicer.agent import AgentConfig, NodeAgent
    from gpu_slicer.slicer.cdi import load_toolkit_spec
    from gpu_slicer.slicer.simulated import SimulatedBackend

    def agent(config: AgentConfig) -> NodeAgent:
        return NodeAgent(config, backend=SimulatedBackend("A30:1"), api=InMemoryKubeApi())

    bare = agent(
        AgentConfig(
            node="n",
            checkpoint_dir=short_dir / "c",
            cdi_dir=short_dir / "d",
            plugins_dir=short_dir / "p",
            registry_dir=short_dir / "r",
        )
    )
    bare._report_facts()
    assert bare.metrics.value("gpu_slicer_agent_cdi_toolkit_edits") == 0
    assert "CUDA will not run" in caplog.text
    with_toolkit = agent(
        AgentConfig(
            node="n",
            checkpoint_dir=short_dir / "c2",
            cdi_dir=short_dir / "d2",
            plugins_dir=short_dir / "p2",
            registry_dir=short_dir / "r2",
            cdi_common=load_toolkit_spec(TOOLKIT_SPEC),
        )
    )
    with_toolkit._report_facts()
    assert with_toolkit.metrics.value("gpu_slicer_agent_cdi_toolkit_edits") == 1


def test_the_agent_process_serves_the_kubelet_and_stops_cleanly_on_sigterm(
    short_dir: Path,
) -> None:
    port = free_port()
    registry, plugins = short_dir / "reg", short_dir / "plugins"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpu_slicer.cli.main",
            *simulated_agent_args(short_dir),
            "--simulate-state",
            str(short_dir / "gpus.json"),
            "--metrics-bind",
            f"127.0.0.1:{port}",
            "--reconcile-interval",
            "0.5",
            "--toolkit-cdi-spec",
            str(TOOLKIT_SPEC),
            "--always-advertise",
            "1g.10gb",  # nothing asks on an empty API: the floor keeps a MIG device to watch
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    reg_sock = registry / "z.gpu-slicer.io-reg.sock"
    legacy_sock = registry / "gpu-slicer.io-reg.sock"
    try:
        deadline = time.monotonic() + 60
        while not legacy_sock.exists():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the agent never created its sockets"
            time.sleep(0.1)
        infos = {}
        for sock in (reg_sock, legacy_sock):
            with grpc.insecure_channel(f"unix://{sock}") as channel:
                registration = pluginregistration_pb2_grpc.RegistrationStub(  # type: ignore[no-untyped-call]
                    channel
                )
                info = registration.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=20)
                infos[info.name] = info.endpoint
        # One DRA service under the new name and 0.1's, so that claims allocated under the old
        # name are still prepared and released after an upgrade.
        assert infos == dict.fromkeys(
            ("z.gpu-slicer.io", "gpu-slicer.io"), str(plugins / "z.gpu-slicer.io" / "dra.sock")
        )
        with grpc.insecure_channel(f"unix://{infos['z.gpu-slicer.io']}") as channel:
            dra = dra_v1_pb2_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
            response = dra.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(
                    claims=[dra_v1_pb2.Claim(namespace="ml", uid="u-1", name="nothing")]
                ),
                timeout=20,
            )
            assert "does not exist" in response.claims["u-1"].error
            _health_follows_a_simulated_xid(channel, short_dir / "gpus.json")
        metrics = ""
        while "gpu_slicer_agent_free_memory_slices" not in metrics:
            assert time.monotonic() < deadline, metrics
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                metrics = r.read().decode()
            time.sleep(0.1)
        assert 'gpu_slicer_agent_free_memory_slices{gpu="0"} 8.0' in metrics
        assert "gpu_slicer_agent_cdi_toolkit_edits 1.0" in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert not reg_sock.exists() and not legacy_sock.exists()
    assert not (plugins / "z.gpu-slicer.io" / "dra.sock").exists()


def _health_follows_a_simulated_xid(channel: grpc.Channel, state: Path) -> None:
    """The agent's health stream on its DRA socket: healthy, then GPU 0's devices unhealthy
    once `gpu-slicer agent simulate-event` queues a critical Xid for the running agent."""
    pb = dra_health_v1alpha1_pb2
    stub = dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(channel)  # type: ignore[no-untyped-call]
    stream = stub.NodeWatchResources(pb.NodeWatchResourcesRequest(), timeout=60)
    try:
        first = next(stream)
        assert {d.health for d in first.devices} <= {pb.HEALTHY}
        assert (
            main(
                [
                    "agent",
                    "simulate-event",
                    "--simulate-state",
                    str(state),
                    "--gpu",
                    "0",
                    "--xid",
                    "79",
                ]
            )
            == 0
        )
        for message in stream:
            health = {d.device.device_name: d.health for d in message.devices}
            if health.get("gpu-0") == pb.UNHEALTHY:
                break
        assert health["gpu-0-mig-1g10gb-0"] == pb.UNHEALTHY
        assert "xid-79" in next(d.message for d in message.devices if d.health == pb.UNHEALTHY)
    finally:
        stream.cancel()
    assert not list((state.parent / "gpus.json.events").iterdir())  # the agent took it


def test_simulate_event_refuses_what_no_agent_could_take(
    short_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = short_dir / "gpus.json"
    assert (
        main(["agent", "simulate-event", "--simulate-state", str(state), "--gpu", "0", "--lost"])
        == 2
    )
    assert "not a running simulated agent's state file" in capsys.readouterr().err
    from gpu_slicer.slicer.simulated import SimulatedBackend
    from gpu_slicer.slicer.simulated_store import PersistedBackend

    PersistedBackend(SimulatedBackend("A100-80GB:2"), state)
    assert (
        main(
            ["agent", "simulate-event", "--simulate-state", str(state), "--gpu", "2", "--recovered"]
        )
        == 2
    )
    assert "--gpu 2: the node has GPUs 0-1" in capsys.readouterr().err
    assert not (short_dir / "gpus.json.events").exists()


def _settings_and_warnings(
    argv: list[str], environ: dict[str, str], caplog: pytest.LogCaptureFixture
) -> tuple[str, list[str]]:
    caplog.clear()
    with caplog.at_level("WARNING", logger="gpu_slicer.slicer.cli"):
        settings = agent_settings(build_parser().parse_args(["agent", "run", *argv]), environ)
    return settings.device_order, [r.getMessage() for r in caplog.records]


def test_the_device_order_has_its_own_flag_and_variable(caplog: pytest.LogCaptureFixture) -> None:
    assert _settings_and_warnings([], {}, caplog) == ("best-fit", [])
    assert _settings_and_warnings(["--device-order", "name"], {}, caplog) == ("name", [])
    env = {"GPU_SLICER_DEVICE_ORDER": "anti-fragmentation"}
    assert _settings_and_warnings([], env, caplog) == ("anti-fragmentation", [])


def test_the_old_policy_flag_still_sets_the_device_order_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    order, warnings = _settings_and_warnings(["--policy", "name"], {}, caplog)
    assert order == "name"
    assert warnings == ["--policy is deprecated for agent run: use --device-order"]
    order, _ = _settings_and_warnings(
        ["--policy", "name", "--device-order", "anti-fragmentation"], {}, caplog
    )
    assert order == "anti-fragmentation"  # the new flag wins


def test_the_old_variable_sets_the_device_order_only_when_it_names_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    order, warnings = _settings_and_warnings([], {"GPU_SLICER_POLICY": "name"}, caplog)
    assert order == "name"
    assert len(warnings) == 1 and "GPU_SLICER_DEVICE_ORDER" in warnings[0]
    # One environment for webhook serve and agent run: the webhook's policy file is not the
    # agent's, which keeps its default and says nothing (it used to refuse to start).
    shared = {"GPU_SLICER_POLICY": "/etc/gpu-slicer/policy/policy.yaml"}
    assert _settings_and_warnings([], shared, caplog) == ("best-fit", [])
    both = {"GPU_SLICER_POLICY": "name", "GPU_SLICER_DEVICE_ORDER": "anti-fragmentation"}
    assert _settings_and_warnings([], both, caplog) == ("anti-fragmentation", [])
