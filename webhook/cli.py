"""Subcommands of the webhook package."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds this package's subcommands (none yet)."""
