"""Bad input to `gpu-slicer certs issue` and `certs ensure`: exit 2 and a message naming the
problem before anything is written or any cluster is contacted."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_slicer.cli.main import main

ENSURE = ["certs", "ensure", "--namespace", "n", "--secret", "s", "--webhook-config", "w"]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def test_issue_refuses_an_empty_out_instead_of_writing_into_the_working_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, err = run(["certs", "issue", "--service", "s", "--namespace", "n", "--out", ""], capsys)
    assert code == 2
    assert "--out: an empty path" in err
    assert list(tmp_path.iterdir()) == []


def test_issue_names_an_out_that_is_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "afile"
    target.write_text("x")
    code, err = run(
        ["certs", "issue", "--service", "s", "--namespace", "n", "--out", str(target)], capsys
    )
    assert code == 2
    assert f"--out {target} is a file, not a folder" in err


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--secret", "Bad_Secret", "--secret 'Bad_Secret' is not a valid Secret name"),
        ("--secret", "a" * 252, "at most 250 characters"),
        ("--webhook-config", "a b", "--webhook-config 'a b' is not a valid"),
    ],
)
def test_ensure_checks_object_names_before_contacting_a_cluster(
    flag: str, value: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*ENSURE, flag, value]

    code, err = run(argv, capsys)
    assert code == 2
    assert named in err
    assert "Kubernetes" not in err


def test_ensure_names_a_missing_or_folder_kubeconfig(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run([*ENSURE, "--kubeconfig", str(tmp_path / "nope")], capsys)
    assert code == 2
    assert f"--kubeconfig {tmp_path / 'nope'} does not exist" in err
    code, err = run([*ENSURE, "--kubeconfig", str(tmp_path)], capsys)
    assert code == 2
    assert f"--kubeconfig {tmp_path} is not a file" in err


@pytest.mark.parametrize("content", [b"\xff\xfe\x00bad", b"- 1\n- 2\n"])
def test_ensure_names_a_kubeconfig_the_client_cannot_parse(
    content: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_bytes(content)
    code, err = run([*ENSURE, "--kubeconfig", str(kubeconfig)], capsys)
    assert code == 1
    assert f"cannot load Kubernetes credentials from {kubeconfig}" in err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (
            [
                "certs",
                "issue",
                "--service",
                "s",
                "--namespace",
                "n",
                "--out",
                "{out}",
                "--days",
                "99999999",
                "--ca-days",
                "99999999",
            ],
            "argument --days: 99999999 days",
        ),
        ([*ENSURE, "--rotation-grace", "1e300"], "argument --rotation-grace: 1e300 is more"),
        ([*ENSURE, "--interval", "inf"], "argument --interval: inf is more"),
        ([*ENSURE, "--interval", "nan"], "argument --interval: nan must be more than 0"),
    ],
)
def test_lifetimes_and_intervals_too_large_for_dates_and_timers_are_usage_errors(
    argv: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run([a.format(out=tmp_path / "out") for a in argv], capsys)
    assert code == 2
    assert named in err
    assert not (tmp_path / "out").exists()
