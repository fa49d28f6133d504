"""The files of a tree as ``gpu-slicer convert`` reads and writes them, never leaving the tree.

A GitOps repository is a folder someone else controls: it may hold symlinks to anywhere on the
machine, and the output folder may hold them too. So:

* the tree is walked without following a symlink; one that stays inside the tree is recorded
  (``--out-dir`` recreates it as a symlink, relative, as an overlay's ``base -> ../../base``
  must stay), one that leads outside or nowhere is named and left out: its target is never read
  or copied;
* a file is opened with ``O_NOFOLLOW``, so one replaced by a symlink during the run is not read
  through it, and one deleted during the run is named as such;
* every write goes through folders checked not to be symlinks, to a temporary file in the same
  folder renamed over the target (:mod:`kube.atomic_files`): a symlink at the target is replaced,
  never written through, an interrupted run leaves each file old or new, and the file gets the
  source's mode;
* hidden files (``.sops.yaml``, ``.gitignore``) and hidden folders other than ``.git`` are
  copied, never converted; so are a Helm chart's ``templates/`` (not YAML until rendered) and
  the ``<name>.gpu-slicer.<ext>`` files ``--beside`` wrote.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from gpu_slicer.kube.atomic_files import write_atomically
from gpu_slicer.webhook.errors import TreeFileError

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
BESIDE_INFIX = ".gpu-slicer"
"""``--beside`` writes ``<stem>.gpu-slicer<suffix>``: never read back as a source."""
CHART_FILE = "Chart.yaml"


@dataclass
class Walk:
    """What a walk of the tree found, every path relative to its root."""

    manifests: list[PurePosixPath] = field(default_factory=list)
    """Files to convert (.yaml, .yml, .json), in path order."""
    others: list[PurePosixPath] = field(default_factory=list)
    """Files copied as they are by ``--out-dir``."""
    links: dict[PurePosixPath, str] = field(default_factory=dict)
    """Symlinks that stay inside the tree, and the relative target to recreate them with."""
    warnings: list[str] = field(default_factory=list)
    """What was left out and why (symlinks out of the tree, special files, unreadable folders)."""
    notes: list[str] = field(default_factory=list)
    """What is copied but not converted (a chart's templates)."""


def beside_name(relative: PurePosixPath) -> PurePosixPath:
    """Where ``--beside`` writes the conversion of ``relative``."""
    return relative.with_name(f"{relative.stem}{BESIDE_INFIX}{relative.suffix}")


def _is_beside_output(name: str) -> bool:
    stem, dot, suffix = name.rpartition(".")
    return bool(dot) and f".{suffix.lower()}" in MANIFEST_SUFFIXES and stem.endswith(BESIDE_INFIX)


def walk(root: Path, exclude: Path | None = None) -> Walk:
    """The files under ``root`` (``exclude``, an output folder inside it, left out), without
    following symlinks."""
    found = Walk()
    real_root = os.path.realpath(root)
    real_exclude = os.path.realpath(exclude) if exclude is not None else None
    charts: list[PurePosixPath] = []

    def failed(error: OSError) -> None:
        where = _relative(root, Path(error.filename or root))
        found.warnings.append(f"{where}/: cannot read the folder ({error.strerror}); left out")

    for current, folders, files in os.walk(root, followlinks=False, onerror=failed):
        here = _relative(root, Path(current))
        kept = []
        for name in sorted(folders):
            path = Path(current) / name
            relative = here / name
            if path.is_symlink():
                _link(found, path, relative, real_root, real_exclude)
            elif name == ".git" or (
                real_exclude is not None and os.path.realpath(path) == real_exclude
            ):
                continue
            else:
                kept.append(name)
                if name == "templates" and (Path(current) / CHART_FILE).is_file():
                    charts.append(relative)
                    found.notes.append(
                        f"{relative}/: a Helm chart's templates, copied as they are: render the "
                        "chart and convert its output (helm's --post-renderer)"
                    )
        folders[:] = kept
        for name in sorted(files):
            path = Path(current) / name
            relative = here / name
            try:
                mode = path.lstat().st_mode
            except OSError as exc:
                found.warnings.append(f"{relative}: {_read_problem(exc)}")
                continue
            if stat.S_ISLNK(mode):
                _link(found, path, relative, real_root, real_exclude)
            elif not stat.S_ISREG(mode):
                found.warnings.append(f"{relative}: not a regular file; left out")
            elif _is_manifest(relative, charts):
                found.manifests.append(relative)
            else:
                found.others.append(relative)
    found.manifests.sort()
    found.others.sort()
    return found


def _is_manifest(relative: PurePosixPath, charts: list[PurePosixPath]) -> bool:
    return (
        relative.suffix.lower() in MANIFEST_SUFFIXES
        and not any(part.startswith(".") for part in relative.parts)
        and not _is_beside_output(relative.name)
        and not any(relative.is_relative_to(chart) for chart in charts)
    )


def _relative(root: Path, path: Path) -> PurePosixPath:
    return PurePosixPath(Path(os.path.relpath(path, root)).as_posix())


def _link(
    found: Walk,
    path: Path,
    relative: PurePosixPath,
    real_root: str,
    real_exclude: str | None,
) -> None:
    """Records the symlink at ``path``: recreated when it stays in the tree, else named."""
    text = os.readlink(path)
    target = os.path.realpath(path)
    inside = target == real_root or target.startswith(real_root + os.sep)
    if real_exclude is not None and (
        target == real_exclude or target.startswith(real_exclude + os.sep)
    ):
        inside = False
    if inside and os.path.lexists(target) and os.path.exists(path):
        found.links[relative] = os.path.relpath(target, os.path.realpath(path.parent))
        return
    where = "outside the tree" if os.path.exists(path) else "which does not exist"
    found.warnings.append(
        f"{relative}: a symlink to {text}, {where}: not followed, neither read nor copied"
    )


def read(root: Path, relative: PurePosixPath) -> tuple[bytes, int]:
    """The bytes of a regular file of the tree and its mode; raises TreeFileError (named by the
    caller) when it cannot be read as one, without following a symlink."""
    path = root / relative
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise TreeFileError(_read_problem(exc)) from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TreeFileError("no longer a regular file; left out")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks), stat.S_IMODE(info.st_mode)
    except OSError as exc:
        raise TreeFileError(_read_problem(exc)) from exc
    finally:
        os.close(fd)


def read_text(root: Path, relative: PurePosixPath) -> tuple[str, int]:
    """:func:`read` as UTF-8 text."""
    data, mode = read(root, relative)
    try:
        return data.decode("utf-8"), mode
    except UnicodeDecodeError as exc:
        raise TreeFileError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc


def _read_problem(exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return "deleted during the run; left out"
    if exc.errno == errno.ELOOP:
        return "became a symlink during the run: not followed; left out"
    return f"cannot read: {exc.strerror or exc}"


def still_there(root: Path, relative: PurePosixPath) -> None:
    """Raise TreeFileError when the source ``relative`` was deleted (or replaced by something
    other than a regular file) since it was read."""
    try:
        mode = (root / relative).lstat().st_mode
    except FileNotFoundError as exc:
        raise TreeFileError("deleted during the run: its conversion is not written") from exc
    if not stat.S_ISREG(mode):
        raise TreeFileError("replaced during the run: its conversion is not written")


def default_mode() -> int:
    """The mode a new file gets under the process's umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


class Writer:
    """Writes files and symlinks under ``root`` without following a symlink below it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, relative: PurePosixPath, data: bytes, mode: int) -> Path:
        """Replaces ``root/relative`` with ``data`` atomically; raises TreeFileError."""
        target = self._folder(relative.parent) / relative.name
        try:
            if target.is_dir() and not target.is_symlink():
                raise TreeFileError(f"{target} is a folder: not replaced")
            write_atomically(target, data, mode=mode, durable=False)
        except OSError as exc:
            raise TreeFileError(f"cannot write {target}: {exc.strerror or exc}") from exc
        return target

    def link(self, relative: PurePosixPath, pointing_to: str) -> Path:
        """Makes ``root/relative`` a symlink to ``pointing_to`` (replacing what is there)."""
        target = self._folder(relative.parent) / relative.name
        if target.is_dir() and not target.is_symlink():
            raise TreeFileError(f"{target} is a folder: not replaced by a symlink")
        temporary = target.with_name(f".{target.name}.{os.getpid()}.link")
        try:
            temporary.unlink(missing_ok=True)
            os.symlink(pointing_to, temporary)
            os.replace(temporary, target)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise TreeFileError(f"cannot write {target}: {exc.strerror or exc}") from exc
        return target

    def _folder(self, relative: PurePosixPath) -> Path:
        """``root/relative``, made where missing, each step checked not to be a symlink."""
        folder = self.root
        for part in relative.parts:
            folder = folder / part
            try:
                folder.mkdir(exist_ok=True)
            except FileExistsError:
                pass  # a file or a symlink: refused below
            except OSError as exc:
                raise TreeFileError(f"cannot create {folder}: {exc.strerror or exc}") from exc
            mode = folder.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise TreeFileError(f"{folder} is a symlink: not written through")
            if not stat.S_ISDIR(mode):
                raise TreeFileError(f"{folder} is not a folder")
        return folder
