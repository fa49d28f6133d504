"""Errors of the sandbox.

``SandboxError``
 ├── ``UsageError``     bad flags, ports or folders: the command exits 2 with the message
 ├── ``BuildError``     the Go toolchain is missing or a build failed
 └── ``StartupError``   a component did not start or become ready (its log is named)
"""

from __future__ import annotations


class SandboxError(Exception):
    """Anything the sandbox reports to its user as one line."""


class UsageError(SandboxError):
    """The user can fix this by changing a flag, a port or a folder."""


class BuildError(SandboxError):
    """The control-plane binaries could not be built or found."""


class StartupError(SandboxError):
    """A component exited or did not become ready in time."""
