"""``gpu-slicer completion bash|zsh``: shell completion generated from the parser itself.

The script is a table of the command tree (subcommands, flags, and the choices of flags that
have them) and one small function that walks it, so it never falls behind the parser: it is
rebuilt from ``build_parser()`` each time it is printed. zsh loads the same function through
its bash-completion layer (``bashcompinit``).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """One node of the command tree: its words after ``gpu-slicer`` and its parser."""

    path: tuple[str, ...]
    parser: argparse.ArgumentParser

    @property
    def subcommands(self) -> dict[str, argparse.ArgumentParser]:
        for action in self.parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}


def walk(parser: argparse.ArgumentParser) -> Iterator[Command]:
    """Every command of the tree, parents before children."""
    stack = [Command((), parser)]
    while stack:
        command = stack.pop(0)
        yield command
        stack += [Command((*command.path, name), sub) for name, sub in command.subcommands.items()]


def leaves(parser: argparse.ArgumentParser) -> list[Command]:
    """The commands that run something (no further subcommands)."""
    return [c for c in walk(parser) if c.path and not c.subcommands]


def _flags(parser: argparse.ArgumentParser) -> tuple[list[str], dict[str, list[str]]]:
    flags: list[str] = []
    choices: dict[str, list[str]] = {}
    for action in parser._actions:
        flags += [o for o in action.option_strings if o.startswith("--") or len(o) == 2]
        if (
            action.choices is not None
            and action.option_strings
            and not isinstance(action, argparse._SubParsersAction)
        ):
            for option in action.option_strings:
                choices[option] = [str(c) for c in action.choices]
    return sorted(set(flags)), choices


def _positional_choices(parser: argparse.ArgumentParser) -> list[str]:
    return [
        str(c)
        for a in parser._actions
        if not a.option_strings
        and a.choices is not None
        and not isinstance(a, argparse._SubParsersAction)
        for c in a.choices
    ]


def bash_script(parser: argparse.ArgumentParser) -> str:
    lines = [
        "# gpu-slicer completion for bash; load with:  source <(gpu-slicer completion bash)",
        "declare -A _gpu_slicer_sub _gpu_slicer_opts _gpu_slicer_choices",
    ]
    for command in walk(parser):
        key = " ".join(("gpu-slicer", *command.path))  # bash refuses an empty key
        words = sorted(command.subcommands) + _positional_choices(command.parser)
        flags, choices = _flags(command.parser)
        lines.append(f"_gpu_slicer_sub[{shlex.quote(key)}]={shlex.quote(' '.join(words))}")
        lines.append(f"_gpu_slicer_opts[{shlex.quote(key)}]={shlex.quote(' '.join(flags))}")
        for flag, values in sorted(choices.items()):
            lines.append(
                f"_gpu_slicer_choices[{shlex.quote(f'{key}|{flag}')}]="
                f"{shlex.quote(' '.join(values))}"
            )
    lines.append(r"""_gpu_slicer() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
    local path="gpu-slicer" word next i
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${COMP_WORDS[i]}"
        next="$path $word"
        if [[ "$word" != -* && -n "${_gpu_slicer_opts[$next]+set}" ]]; then
            path="$next"
        fi
    done
    if [[ -n "${_gpu_slicer_choices[$path|$prev]+set}" ]]; then
        COMPREPLY=($(compgen -W "${_gpu_slicer_choices[$path|$prev]}" -- "$cur"))
    elif [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "${_gpu_slicer_opts[$path]}" -- "$cur"))
    elif [[ -n "${_gpu_slicer_sub[$path]}" ]]; then
        COMPREPLY=($(compgen -W "${_gpu_slicer_sub[$path]}" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}
complete -o filenames -F _gpu_slicer gpu-slicer""")
    return "\n".join(lines) + "\n"


def zsh_script(parser: argparse.ArgumentParser) -> str:
    body = bash_script(parser).split("\n", 1)[1]
    return (
        "#compdef gpu-slicer\n"
        "# gpu-slicer completion for zsh; load with:  source <(gpu-slicer completion zsh)\n"
        "autoload -U +X bashcompinit && bashcompinit\n" + body
    )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``completion``."""
    p = subparsers.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description="Print the completion script for SHELL. bash: source <(gpu-slicer "
        "completion bash), or save it in /etc/bash_completion.d/gpu-slicer. zsh: "
        "source <(gpu-slicer completion zsh) in ~/.zshrc.",
    )
    p.add_argument("shell", choices=["bash", "zsh"], metavar="SHELL", help="bash or zsh")
    p.set_defaults(func=run_completion)


def run_completion(args: argparse.Namespace) -> int:
    from gpu_slicer.cli.main import build_parser

    parser = build_parser()
    sys.stdout.write(bash_script(parser) if args.shell == "bash" else zsh_script(parser))
    return 0
