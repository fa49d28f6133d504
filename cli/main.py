"""Entry point of the ``gpu-slicer`` console script.

Each package owns its subcommands in its own ``cli`` module, which exposes
``register(subparsers)``; a subcommand stores its handler as ``func`` and returns an exit code.
Exit codes: 0 success, 1 runtime failure, 2 bad usage or bad input (argparse's convention).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn, cast

COMMANDS: dict[str, str] = {
    "agent": "gpu_slicer.slicer.cli",
    "catalog": "gpu_slicer.slicer.cli",
    "slices": "gpu_slicer.slicer.cli",
    "convert": "gpu_slicer.webhook.cli",
    "policy": "gpu_slicer.webhook.cli",
    "webhook": "gpu_slicer.webhook.cli",
    "certs": "gpu_slicer.certs.cli",
    "simulate": "gpu_slicer.sim.cli",
    "sandbox": "gpu_slicer.sandbox.cli",
    "plan": "gpu_slicer.plan.cli",
    "status": "gpu_slicer.status.cli",
    "uninstall-check": "gpu_slicer.status.uninstall",
}
"""The module that registers each command, in the order of ``--help``. A command given on the
command line needs only its own module imported (:func:`modules_for`): the agent's ``cli``
alone imports the agent, half a second that ``convert`` has no use for."""
COMMAND_MODULES = tuple(dict.fromkeys(COMMANDS.values()))

CHECKOUT_ONLY = {"gpu_slicer.sandbox.cli": "sandbox"}
"""Commands of development tooling that a source checkout has and an installed package (the
image's, a wheel's) does not: there the command is listed and says where to find it."""


LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


class Parser(argparse.ArgumentParser):
    """argparse with the project's one error style: the usage of the (sub)command that was
    given, then ``gpu-slicer <command>: <problem>``, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: {message}\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpu-slicer")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """argparse's ``version`` action, the version looked up only when asked for (reading the
    package's metadata costs every command tens of milliseconds)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(
            option_strings,
            dest=argparse.SUPPRESS,
            default=argparse.SUPPRESS,
            nargs=0,
            help="show program's version number and exit",
        )

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        formatter = parser._get_formatter()
        formatter.add_text(f"gpu-slicer {_version()}")
        parser._print_message(formatter.format_help(), sys.stdout)
        parser.exit()


def modules_for(argv: Sequence[str]) -> tuple[str, ...]:
    """The command modules a parser for ``argv`` needs: the named command's own when one of
    :data:`COMMANDS` comes first (after ``--log-level LEVEL``), none for a lone ``--version``,
    every one otherwise (help, completion, a mistake), so that what is printed never differs."""
    rest = list(argv)
    if rest[:1] == ["--log-level"]:
        rest = rest[2:]
    elif rest and rest[0].startswith("--log-level="):
        rest = rest[1:]
    if rest == ["--version"]:
        return ()
    module = COMMANDS.get(rest[0]) if rest else None
    return (module,) if module is not None else COMMAND_MODULES


def build_parser(modules: Sequence[str] = COMMAND_MODULES) -> argparse.ArgumentParser:
    """The parser of every command (``modules``: of those commands only, see
    :func:`modules_for`)."""
    parser = Parser(
        prog="gpu-slicer",
        description="Move GPU workloads from the device plugin to DRA with just-in-time MIG.",
    )
    parser.add_argument("--version", action=_VersionAction)
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=LOG_LEVELS,
        help="log verbosity (logs are JSON lines on stderr)",
    )
    # Typed as the base class every package's register() takes; the parsers are Parser.
    subparsers = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", metavar="COMMAND", required=True),
    )
    for name in modules:
        _register(name, subparsers)
    from gpu_slicer.cli import completion

    if tuple(modules) == COMMAND_MODULES:
        completion.register(subparsers)
    for leaf in completion.leaves(parser):
        # Accepted after the subcommand too; SUPPRESS keeps the top-level value when absent.
        if "--log-level" not in leaf.parser._option_string_actions:
            leaf.parser.add_argument(
                "--log-level",
                choices=LOG_LEVELS,
                default=argparse.SUPPRESS,
                help="log verbosity (also accepted before the command)",
            )
        leaf.parser.set_defaults(_parser=leaf.parser)
    return parser


def _register(module: str, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module not in CHECKOUT_ONLY or not (module + ".").startswith(missing + "."):
            raise
        _register_absent(CHECKOUT_ONLY[module], subparsers)
        return
    loaded.register(subparsers)


def _register_absent(
    command: str, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]
) -> None:
    parser = subparsers.add_parser(
        command, help="(a source checkout only: not part of this installation)", add_help=False
    )
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def absent(args: argparse.Namespace) -> int:
        print(
            f"gpu-slicer {command}: development tooling, run from a source checkout of "
            "gpu-slicer (pip install -e . in the repository); this installation does not "
            "include it",
            file=sys.stderr,
        )
        return 2

    parser.set_defaults(func=absent)


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Like ``parse_args``, but an unknown flag is reported with the usage of the subcommand
    it was given to, not the top-level one."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        owner: argparse.ArgumentParser = getattr(args, "_parser", parser)
        owner.error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(modules_for(sys.argv[1:] if argv is None else argv))
    args = parse(parser, argv)
    from gpu_slicer.cli.logs import configure_logging

    configure_logging(args.log_level)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except RecursionError:
        # Only input can nest this deep (YAML or JSON thousands of levels down).
        print(f"gpu-slicer {args.command}: the input is nested too deeply to read", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `gpu-slicer ... | head`: the reader left; that is not an error of ours.
        sys.stderr.close()
        return 0
    except Exception as exc:  # a bug, not bad input: one line, the traceback at DEBUG
        logging.getLogger("gpu_slicer.cli").debug("unhandled error", exc_info=True)
        print(
            f"gpu-slicer {args.command}: internal error: {type(exc).__name__}: {exc} "
            "(please report it; --log-level DEBUG shows where)",
            file=sys.stderr,
        )
        return 1
    logging.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
