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

COMMAND_MODULES = ("slicer.cli", "webhook.cli", "certs.cli", "sim.cli", "sandbox.cli", "cli.plan")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-slicer",
        description="Move GPU workloads from the device plugin to DRA with just-in-time MIG.",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log verbosity (logs are JSON lines on stderr)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from cli.logs import configure_logging

    configure_logging(args.log_level)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except RecursionError:
        # Only input can nest this deep (YAML or JSON thousands of levels down).
        print(f"gpu-slicer {args.command}: the input is nested too deeply to read",
              file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `gpu-slicer ... | head`: the reader left; that is not an error of ours.
        sys.stderr.close()
        return 0
    except Exception as exc:  # a bug, not bad input: one line, the traceback at DEBUG
        logging.getLogger("gpu_slicer.cli").debug("unhandled error", exc_info=True)
        print(f"gpu-slicer {args.command}: internal error: {type(exc).__name__}: {exc} "
              "(please report it; --log-level DEBUG shows where)", file=sys.stderr)
        return 1
    logging.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
