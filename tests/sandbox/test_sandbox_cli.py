"""`gpu-slicer sandbox up` refuses bad input in one line with exit 2, before starting anything."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import pytest

from gpu_slicer.cli.main import main
from gpu_slicer.sandbox.nodes import NodeSpec
from gpu_slicer.sandbox.sandbox import check_state_dir


def _up(tmp_path: Path, *extra: str) -> list[str]:
    return ["sandbox", "up", "--state-dir", str(tmp_path / "sb"), *extra]


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--node", "gpu-node"], "is not NAME=GPUSPEC"),
        (["--node", "Big_Node=H100-80GB:1"], "is not a valid node name"),
        (["--node", "n=H999:1"], "--node 'n=H999:1'"),
        (["--node", "a=H100-80GB:1", "--node", "a=A100-80GB:1"], "names a more than once"),
        (["--k8s-version", "1.20"], "is not supported"),
        (["--gpu-slicer", "/nonexistent/bin/gpu-slicer"], "is not an executable file"),
        (["--gpu-slicer", "/"], "--gpu-slicer / is not an executable file"),
        (["--node", "a=H100-80GB:1", "--real-node", "b"], "--real-node b: no such --node"),
        (["--install", "helm", "--agent-pod"], "--agent-pod needs --real-node NAME and --install"),
        (
            ["--webhook-pod"],
            "--webhook-pod needs --real-node NAME and --install helm",
        ),
        (
            ["--node", "a=H100-80GB:1", "--real-node", "a", "--install", "helm", "--webhook-pod"]
            + ["--webhook-policy", "/dev/null"],
            "--webhook-pod: the webhook pod reads the chart's policy value",
        ),
        (["--import-image", "/dev/null"], "--import-image needs --real-node NAME"),
        (
            ["--node", "a=H100-80GB:1", "--real-node", "a", "--import-image", "/nonexistent.tar"],
            "--import-image /nonexistent.tar: no such file",
        ),
    ],
    ids=[
        "no spec",
        "bad node name",
        "unknown model",
        "duplicate node",
        "old version",
        "no such command",
        "a folder as command",
        "real",
        "agent pod without a real node",
        "webhook pod without a real node",
        "webhook pod with a policy file",
        "image without a real node",
        "missing image",
    ],
)
def test_bad_flags_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], fragment: str
) -> None:
    assert main(_up(tmp_path, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "sb").exists()


def test_a_port_in_use_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    tmp_path = Path(tempfile.mkdtemp(prefix="gs-"))  # short: socket paths must fit
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(_up(tmp_path, "--apiserver-port", str(port))) == 2
    assert f"--apiserver-port {port}: 127.0.0.1:{port} is not free" in capsys.readouterr().err


def test_a_folder_that_is_not_a_sandbox_is_never_cleared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "sb"
    folder.mkdir()
    (folder / "precious.txt").write_text("keep me")
    assert main(_up(tmp_path)) == 2
    assert "is not empty and not a sandbox's folder" in capsys.readouterr().err
    assert (folder / "precious.txt").read_text() == "keep me"


def test_a_state_dir_that_is_a_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "sb").write_text("")
    assert main(_up(tmp_path)) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_a_state_dir_too_deep_for_unix_sockets_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deep = tmp_path / ("d" * 90)
    assert main(["sandbox", "up", "--state-dir", str(deep)]) == 2
    assert "over the kernel's limit" in capsys.readouterr().err


def _up_real(state: Path, node: str) -> list[str]:
    return [
        "sandbox",
        "up",
        "--state-dir",
        str(state),
        "--node",
        f"{node}=H100-80GB:1",
        "--real-node",
        node,
    ]


def test_a_real_node_under_a_folder_its_namespace_replaces_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    state = Path("/var/log/gs-never-created/sb")
    assert main(_up_real(state, "a")) == 2
    err = capsys.readouterr().err.strip()
    assert "--real-node a: this machine cannot run containers" in err
    assert "is under /var/log" in err
    assert len(err.splitlines()) == 1
    assert not state.parent.exists()


def test_a_real_node_s_socket_paths_are_checked_at_the_kernels_limit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """containerd's ttrpc socket is as long as the agent's DRA socket (both 41 bytes past the
    state folder): one byte over the limit is refused before anything starts, and the folder a
    byte shorter passes."""
    base = Path(tempfile.mkdtemp(prefix="gs-"))
    tails = (
        "/nodes/n/plugins/z.gpu-slicer.io/dra.sock",
        "/nodes/n/containerd/containerd.sock.ttrpc",
    )
    state = base / ("d" * (108 - len(str(base)) - 1 - len(tails[1])))
    assert [len(str(state) + tail) for tail in tails] == [108, 108]
    assert main(_up_real(state, "n")) == 2
    err = capsys.readouterr().err.strip()
    assert "socket paths would be 108 bytes, over the kernel's limit of 107" in err
    assert not state.exists()
    shorter = state.with_name(state.name[:-1])
    check_state_dir(shorter, [NodeSpec("n", "H100-80GB:1")], real_node="n")
