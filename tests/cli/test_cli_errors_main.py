"""`gpu-slicer` itself: no command, --help of every command, and the last-resort handler that
turns an unexpected exception into one line and exit 1 instead of a traceback."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gpu_slicer.cli.main import main

COMMANDS = [
    [],
    ["catalog"],
    ["slices"],
    ["convert"],
    ["policy"],
    ["policy", "check"],
    ["webhook"],
    ["webhook", "serve"],
    ["agent"],
    ["agent", "run"],
    ["certs"],
    ["certs", "issue"],
    ["certs", "ensure"],
    ["simulate"],
]


def test_no_command_is_a_usage_error_naming_the_missing_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    assert "required: COMMAND" in capsys.readouterr().err


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "gpu-slicer")
def test_every_command_has_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: gpu-slicer" in capsys.readouterr().out


def test_an_unexpected_exception_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(args: argparse.Namespace) -> int:
        raise KeyError("boom")

    monkeypatch.setattr("gpu_slicer.slicer.cli.run_catalog", broken)
    assert main(["catalog"]) == 1
    err = capsys.readouterr().err
    assert "gpu-slicer catalog: internal error: KeyError: 'boom'" in err
    assert "Traceback" not in err


def test_input_nested_too_deeply_is_bad_input_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 20000 + "]" * 20000)
    assert main(["webhook", "serve", "--dev", "--policy", str(deep)]) == 2
    assert "nested too deeply" in capsys.readouterr().err
