"""Replacing a file so that a reader sees the old content or the new, never half of it.

The agent's checkpoint and CDI specs, the simulated GPUs' saved state and the webhook's
certificates all rely on the same technique: write a temporary file in the same folder, give it
its mode before any byte is written, flush it, and ``rename`` it over the old name (atomic on
POSIX). ``durable`` adds the two fsyncs (the file, then its folder) that make the new content
survive a power loss; without them the switch is still atomic for every reader.

Modes never depend on the process's umask: :func:`write_atomically` gives each file its mode
explicitly, and :func:`ensure_dir` sets the mode of each folder it creates (``mkdir``'s own
mode is filtered through the umask; under ``umask 000`` a plain ``mkdir`` makes a folder anyone
can write to).
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


def ensure_dir(path: Path, mode: int, *, own: bool = False) -> None:
    """Make ``path`` a folder: each missing folder on the way is created with exactly ``mode``.

    ``own``: the folder is the caller's alone (the agent's checkpoint folder, its socket
    folder), so an existing one gets ``mode`` too; a folder others share (the CDI folder, the
    kubelet's registry) keeps the mode it has.
    """
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, mode)
        except FileExistsError:  # made meanwhile by someone else: theirs
            continue
        os.chmod(folder, mode)
    if own and not missing and (os.stat(path).st_mode & 0o7777) != mode:
        try:
            os.chmod(path, mode)
        except PermissionError:  # another user's folder after all: theirs to set
            pass


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (a crash cannot bring the old name back)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
