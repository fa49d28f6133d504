"""The plan command's errors."""

from __future__ import annotations


class PlanInputError(ValueError):
    """Bad input to ``plan`` (exit 2): a flag, the policy file, or the cluster's policy."""
