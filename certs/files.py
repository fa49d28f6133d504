"""Writing certificate files so that a reader never sees half of a rotation.

Two guarantees, from the same technique the kubelet uses for Secret volumes:

- each file is complete when it appears: it is written to a temporary name in the same folder,
  flushed with ``fsync``, given its mode, and renamed over the old name (``rename`` is atomic);
- the *set* of files changes at once: the files live in a fresh hidden version folder
  (``..<random>``), and one symlink, ``..data``, is atomically repointed to it. The visible names
  (``tls.crt``, ``tls.key``, ``ca.crt``) are symlinks through ``..data``, created once.

A reader that opens ``tls.crt`` and then ``tls.key`` can still straddle the swap between its two
``open`` calls; the webhook's reloading TLS context treats a pair that does not load as "not yet"
and keeps serving the previous certificate until the next check, so together no handshake fails.
Layout of a folder written by :func:`replace_files` (the same as a mounted Secret)::

    DIR/..2a9f.../tls.crt       the files of the current version
    DIR/..data -> ..2a9f...     swapped atomically
    DIR/tls.crt -> ..data/tls.crt
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from gpu_slicer.certs.errors import CertFileError
from gpu_slicer.kube import atomic_files as atomic

DATA_LINK = "..data"

# Modes of the files gpu-slicer writes: keys only for the owner, certificates for everyone.
KEY_MODE = 0o600
CERT_MODE = 0o644


def write_cert_file(path: Path, data: bytes, *, mode: int = CERT_MODE) -> None:
    """Writes ``data`` to ``path`` (temporary file with ``mode``, fsync, rename, fsync)."""
    path = Path(path)
    try:
        atomic.write_atomically(path, data, mode=mode)
    except OSError as exc:
        raise CertFileError(f"cannot write {path}: {exc.strerror or exc}") from exc


def _relink(link: Path, target: str) -> None:
    """Points the symlink ``link`` at ``target`` atomically (a new link renamed over the old)."""
    tmp = link.with_name(f".{link.name}.{secrets.token_hex(4)}.tmp")
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def replace_files(directory: Path, files: Mapping[str, tuple[bytes, int]]) -> list[Path]:
    """Replaces the files ``{name: (data, mode)}`` in ``directory`` as one atomic change.

    Returns the visible paths. Creates ``directory`` if needed. A regular file of the same name
    left by another tool is replaced by the symlink (atomically, by rename); earlier version
    folders are removed once ``..data`` points at the new one.
    """
    directory = Path(directory)
    for name in files:
        if not name or "/" in name or name.startswith("."):
            raise CertFileError(f"{name!r} is not a plain file name")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        version = Path(tempfile.mkdtemp(prefix="..", dir=directory))
        os.chmod(version, 0o755)
        for name, (data, mode) in files.items():
            write_cert_file(version / name, data, mode=mode)
        atomic.fsync_dir(version)
        data_link = directory / DATA_LINK
        _relink(data_link, version.name)
        for name in files:
            visible = directory / name
            wanted = f"{DATA_LINK}/{name}"
            if visible.is_dir() and not visible.is_symlink():
                raise CertFileError(f"{visible} is a folder; remove it or choose another --out")
            if not (visible.is_symlink() and os.readlink(visible) == wanted):
                _relink(visible, wanted)
        atomic.fsync_dir(directory)
        for entry in directory.iterdir():
            # Earlier versions, including any a crash left behind; never the one just linked.
            if entry.name.startswith("..") and entry.name not in (version.name, DATA_LINK):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
    except CertFileError:
        raise
    except OSError as exc:
        raise CertFileError(f"cannot write certificate files in {directory}: {exc}") from exc
    return [directory / name for name in files]
