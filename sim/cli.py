"""Subcommands of the sim package."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds this package's subcommands (none yet)."""
