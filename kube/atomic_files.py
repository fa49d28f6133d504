"""Replacing a file so that a reader sees the old content or the new, never half of it.

The agent's checkpoint and CDI specs, the simulated GPUs' saved state and the webhook's
certificates all rely on the same technique: write a temporary file in the same folder, give it
its mode before any byte is written, flush it, and ``rename`` it over the old name (atomic on
POSIX). ``durable`` adds the two fsyncs (the file, then its folder) that make the new content
survive a power loss; without them the switch is still atomic for every reader.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(
    path: Path, data: bytes, *, mode: int | None = None, durable: bool = True
) -> None:
    """Replace ``path`` with ``data``; OSError (from the OS, unchanged) when it cannot.

    ``mode`` is set on the temporary file first, so a key is never readable by others, not even
    for an instant; without it the file gets ``tempfile``'s owner-only mode.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (a crash cannot bring the old name back)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
