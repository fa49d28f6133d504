"""`gpu-slicer` behaves like the tools admins know: --version, --log-level anywhere, the
subcommand's usage on a typo, one error style, shell completion that follows the parser."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpu_slicer.cli import completion
from gpu_slicer.cli.main import COMMAND_MODULES, COMMANDS, build_parser, main, modules_for


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("gpu-slicer ") and out.split()[1][0].isdigit()


def test_log_level_is_accepted_after_the_subcommand_and_before_it() -> None:
    parser = build_parser()
    assert parser.parse_args(["catalog", "--log-level", "DEBUG"]).log_level == "DEBUG"
    assert parser.parse_args(["--log-level", "ERROR", "catalog"]).log_level == "ERROR"
    assert parser.parse_args(["catalog"]).log_level == "INFO"
    assert (
        parser.parse_args(
            [
                "certs",
                "issue",
                "--out",
                "x",
                "--service",
                "s",
                "--namespace",
                "n",
                "--log-level",
                "WARNING",
            ]
        ).log_level
        == "WARNING"
    )


@pytest.mark.parametrize(
    ("argv", "usage", "prefix"),
    [
        (["simulate", "--sed", "3"], "usage: gpu-slicer simulate", "gpu-slicer simulate: "),
        (
            ["certs", "issue", "--out", "x", "--service", "s", "--namespace", "n", "--dayz", "3"],
            "usage: gpu-slicer certs issue",
            "gpu-slicer certs issue: ",
        ),
        (["catalog", "--gpu"], "usage: gpu-slicer catalog", "gpu-slicer catalog: "),
    ],
    ids=["unknown-flag", "nested-unknown-flag", "missing-value"],
)
def test_a_flag_typo_prints_that_subcommands_usage_and_one_error_line(
    argv: list[str], usage: str, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage)
    last = err.strip().splitlines()[-1]
    assert last.startswith(prefix) and "error:" not in last


def test_every_command_that_runs_something_is_in_the_completion_tree() -> None:
    parser = build_parser()
    paths = {" ".join(c.path) for c in completion.leaves(parser)}
    assert {
        "simulate",
        "plan",
        "completion",
        "certs issue",
        "policy check",
        "agent run",
        "webhook serve",
    } <= paths
    script = completion.bash_script(parser)
    for path in paths:
        assert (
            f"_gpu_slicer_opts['gpu-slicer {path}']" in script
            or f'_gpu_slicer_opts["gpu-slicer {path}"]' in script
        )


def _complete(script: Path, words: list[str]) -> list[str]:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")
    quoted = " ".join(f"'{w}'" for w in words)
    result = subprocess.run(
        [
            bash,
            "-c",
            f"source {script}; COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; "
            "_gpu_slicer; printf '%s\\n' \"${COMPREPLY[@]}\"",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert result.stderr == ""
    return [line for line in result.stdout.splitlines() if line]


def test_bash_completes_commands_flags_and_flag_choices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["completion", "bash"]) == 0
    script = tmp_path / "gpu-slicer.bash"
    script.write_text(capsys.readouterr().out)
    assert _complete(script, ["gpu-slicer", "sim"]) == ["simulate"]
    assert _complete(script, ["gpu-slicer", "certs", ""]) == ["ensure", "issue"]
    assert "--strategies" in _complete(script, ["gpu-slicer", "simulate", "--st"])
    assert _complete(script, ["gpu-slicer", "--log-level", "DEBUG", "plan", "-o", ""]) == [
        "table",
        "json",
    ]
    assert _complete(script, ["gpu-slicer", "completion", ""]) == ["bash", "zsh"]


def test_zsh_completion_loads_the_same_table_through_bashcompinit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["completion", "zsh"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("#compdef gpu-slicer\n") and "bashcompinit" in out
    assert "complete -o filenames -F _gpu_slicer gpu-slicer" in out
    zsh = shutil.which("zsh")
    if zsh is not None:
        subprocess.run([zsh, "-c", out], check=True, timeout=30)


def test_an_unknown_shell_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["completion", "fish"])
    assert exc.value.code == 2
    assert "invalid choice: 'fish'" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["plan"], ["completion"]], ids=lambda c: " ".join(c))
def test_the_new_commands_have_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*command, "--help"])
    assert exc.value.code == 0
    assert f"usage: gpu-slicer {command[0]}" in capsys.readouterr().out


def test_each_command_is_registered_by_the_module_the_table_names() -> None:
    registered: dict[str, str] = {}
    for module in COMMAND_MODULES:
        parser = build_parser((module,))
        for command in completion.walk(parser):
            if len(command.path) == 1:
                registered[command.path[0]] = module
    assert registered == COMMANDS
    every = [c.path[0] for c in completion.walk(build_parser()) if len(c.path) == 1]
    assert every == [*registered, "completion"]  # in the modules' order, as before


def test_a_command_named_first_is_parsed_as_by_the_whole_parser() -> None:
    """Only the named command's module is imported, and the parser it gets is the same: the
    same help and usage for every command and subcommand, the same values parsed."""
    whole = {c.path: c.parser for c in completion.walk(build_parser())}
    for path, parser in whole.items():
        if not path or path[0] == "completion":
            continue
        assert modules_for([*path, "--help"]) == (COMMANDS[path[0]],)
        alone = {c.path: c.parser for c in completion.walk(build_parser(modules_for(path)))}
        assert alone[path].format_help() == parser.format_help(), path
        assert alone[path].format_usage() == parser.format_usage(), path
    named = (["catalog"], ["--log-level", "ERROR", "catalog"], ["--log-level=INFO", "agent", "run"])
    for argv in named:
        assert modules_for(argv) == ("gpu_slicer.slicer.cli",)
        alone_args = vars(build_parser(modules_for(argv)).parse_args(argv))
        whole_args = vars(build_parser().parse_args(argv))
        assert alone_args.keys() == whole_args.keys()
        skip = ("func", "_parser")  # the same functions, parsers built twice
        assert {k: v for k, v in alone_args.items() if k not in skip} == {
            k: v for k, v in whole_args.items() if k not in skip
        }


@pytest.mark.parametrize(
    "argv",
    [[], ["--help"], ["-h", "convert"], ["completion", "bash"], ["convrt"], ["--log", "convert"]],
)
def test_help_completion_and_mistakes_get_every_command(argv: list[str]) -> None:
    assert modules_for(argv) == COMMAND_MODULES
    assert modules_for(["--version"]) == ()
