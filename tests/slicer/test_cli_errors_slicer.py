"""Bad input to `gpu-slicer catalog`, `slices` and `agent run`: exit 2 and a message naming the
problem, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_slicer.cli.main import main


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


SLICES = ["slices", "--node", "n1", "--gpus", "A100-80GB:1"]


def test_a_bad_environment_twin_of_the_agent_does_not_break_other_commands(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPU_SLICER_RECONCILE_INTERVAL", "abc")
    assert main(["catalog", "--gpu", "A100-80GB"]) == 0
    capsys.readouterr()
    code, err = run(["agent", "run", "--node", "n1", "--backend", "simulated"], capsys)
    assert code == 2
    assert "--reconcile-interval" in err and "'abc'" in err


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--reconcile-interval", "nan"], "--reconcile-interval"),
        (["--reconcile-interval", "inf"], "--reconcile-interval"),
        (["--reconcile-interval", "0"], "--reconcile-interval"),
        (["--metrics-bind", "1.2.3.4:99999"], "--metrics-bind"),
        (["--metrics-bind", "nocolon"], "--metrics-bind"),
        (["--device-order", "bogus"], "--device-order 'bogus'"),
        (["--policy", "bogus"], "--device-order 'bogus'"),
        (["--node", "Bad_Node"], "--node 'Bad_Node'"),
    ],
)
def test_bad_agent_flags_exit_2_naming_the_flag(
    extra: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["agent", "run", "--node", "n1", "--backend", "simulated", "--kube", "memory", *extra]
    code, err = run(argv, capsys)
    assert code == 2
    assert named in err


@pytest.mark.parametrize(
    ("env", "value"), [("GPU_SLICER_BACKEND", "gpu"), ("GPU_SLICER_KUBE", "kind")]
)
def test_agent_choices_given_through_the_environment_are_checked(
    env: str, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(env, value)
    code, err = run(["agent", "run", "--node", "n1"], capsys)
    assert code == 2
    assert repr(value) in err


def test_a_static_layout_that_is_not_utf8_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = tmp_path / "layout.yaml"
    layout.write_bytes(b"\xff\xfe\x00bad")
    code, err = run([*SLICES, "--static-layout", str(layout)], capsys)
    assert code == 2
    assert str(layout) in err and "utf-8" in err


def test_a_static_layout_that_is_not_yaml_says_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = tmp_path / "layout.yaml"
    layout.write_text('{"default": [\n')
    code, err = run([*SLICES, "--static-layout", str(layout)], capsys)
    assert code == 2
    assert f"static layout {layout}: not valid YAML" in err and "line 2" in err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["slices", "--node", "Node 1", "--gpus", "A100-80GB"], "--node 'Node 1'"),
        (["slices", "--node", "", "--gpus", "A100-80GB"], "--node ''"),
        ([*SLICES, "--generation", "-1"], "--generation -1"),
        (["slices", "--node", "n1", "--gpus", "A100-80GB:100000"], "at most 64 GPUs"),
        (["slices", "--node", "n1", "--gpus", "A100-80GB:40,A30-24GB:40"], "80 GPUs"),
    ],
)
def test_bad_slices_flags_exit_2_naming_the_problem(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run(argv, capsys)
    assert code == 2
    assert named in err


def test_a_static_layout_nested_too_deeply_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = tmp_path / "layout.yaml"
    layout.write_text("[" * 20000 + "]" * 20000)
    code, err = run([*SLICES, "--static-layout", str(layout)], capsys)
    assert code == 2
    assert f"static layout {layout}: refused at line 1" in err and "nested too deeply" in err


def test_catalog_refuses_an_empty_model_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["catalog", "--gpu", ""], capsys)
    assert code == 2
    assert "unknown GPU model ''" in err


def test_agent_directories_that_are_files_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    argv = [
        "agent",
        "run",
        "--node",
        "n1",
        "--backend",
        "simulated",
        "--kube",
        "memory",
        "--checkpoint-dir",
        str(afile),
    ]
    code, err = run(argv, capsys)
    assert code == 2
    assert f"--checkpoint-dir {afile} is a file, not a folder" in err


@pytest.mark.parametrize(
    "flag", ["--reconcile-interval", "--republish-interval", "--reprobe-interval"]
)
def test_agent_intervals_too_long_for_a_timer_are_named(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "agent",
        "run",
        "--node",
        "n1",
        "--backend",
        "simulated",
        "--kube",
        "memory",
        flag,
        "1e300",
    ]
    code, err = run(argv, capsys)
    assert code == 2
    assert f"{flag} must be a number of seconds" in err and "<= 10,000,000" in err


def test_slices_generation_must_fit_in_64_bits(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run([*SLICES, "--generation", str(2**64)], capsys)
    assert code == 2
    assert "fit in 64 bits" in err


def test_a_metrics_address_the_node_does_not_have_names_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))  # unix socket paths must stay short
    try:
        argv = [
            "agent",
            "run",
            "--node",
            "n1",
            "--backend",
            "simulated",
            "--kube",
            "memory",
            "--checkpoint-dir",
            str(root / "ck"),
            "--cdi-dir",
            str(root / "cdi"),
            "--plugins-dir",
            str(root / "pl"),
            "--registry-dir",
            str(root / "reg"),
            "--metrics-bind",
            "192.0.2.1:9464",
        ]  # TEST-NET-1: never a local address
        code, err = run(argv, capsys)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert code == 1
    assert "--metrics-bind 192.0.2.1:9464" in err
