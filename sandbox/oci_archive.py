"""OCI image archives (a tar of an OCI image layout): pack, name, read and unpack them.

The image the sandbox builds (``sandbox.image``) leaves buildah as an OCI layout folder; this
module turns it into the one-file archive that ``ctr images import`` and ``buildah pull
oci-archive:`` take, with the ``io.containerd.image.name`` annotation containerd names the image
by (without it ``ctr`` imports a layout's image under a made-up prefix or not at all). The tests
read the archive back (manifest, config, layers) with the standard library only, so what they
check is the artifact itself, not what a tool reports about it.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from gpu_slicer.sandbox.errors import BuildError

CONTAINERD_NAME = "io.containerd.image.name"
"""The index annotation containerd's importer names an image by."""
REF_NAME = "org.opencontainers.image.ref.name"
_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"


class ArchiveError(BuildError):
    """An OCI archive or layout is not what the image spec says (missing blob, no manifest)."""


@dataclass(frozen=True)
class Image:
    """The parts of one image in an archive that a runtime reads."""

    name: str
    """The ``io.containerd.image.name`` annotation ('' when absent)."""
    manifest: dict[str, Any]
    config: dict[str, Any]
    """The image configuration: ``config`` holds User, Env, Entrypoint, Cmd, Labels."""


def name_layout(layout: Path, name: str) -> None:
    """Annotate the layout's only image with ``name`` for containerd (``docker.io/library/x:1``)."""
    index_path = layout / "index.json"
    index = json.loads(index_path.read_text(encoding="utf-8"))
    manifests = index.get("manifests") or []
    if len(manifests) != 1:
        raise ArchiveError(f"{index_path} lists {len(manifests)} images; expected exactly one")
    manifests[0].setdefault("annotations", {})[CONTAINERD_NAME] = name
    index_path.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


def pack_layout(layout: Path, archive: Path) -> None:
    """Tar the layout folder into ``archive`` (entries sorted, owned by root, no host times)."""
    with tarfile.open(archive, "w") as tar:
        for path in sorted(layout.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(layout)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if info.isfile():
                with open(path, "rb") as handle:
                    tar.addfile(info, handle)
            else:
                tar.addfile(info)


def read_image(archive: Path) -> Image:
    """The archive's only image: its containerd name, manifest and configuration."""
    with tarfile.open(archive) as tar:
        index = _json_member(tar, "index.json")
        manifests = index.get("manifests") or []
        if len(manifests) != 1:
            raise ArchiveError(f"{archive} lists {len(manifests)} images; expected exactly one")
        entry = manifests[0]
        manifest = _json_member(tar, blob_path(entry["digest"]))
        config = _json_member(tar, blob_path(manifest["config"]["digest"]))
    name = (entry.get("annotations") or {}).get(CONTAINERD_NAME, "")
    return Image(name=name, manifest=manifest, config=config)


def unpack(archive: Path, rootfs: Path) -> Image:
    """Apply the image's layers in order into ``rootfs`` (whiteouts honoured), as a runtime's
    snapshotter does; owners and modes are kept, so this needs root for a faithful tree."""
    image = read_image(archive)
    rootfs.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as outer:
        for layer in image.manifest["layers"]:
            blob = _member(outer, blob_path(layer["digest"]))
            data = gzip.decompress(blob) if "gzip" in layer["mediaType"] else blob
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                _apply_layer(tar, rootfs)
    return image


def _apply_layer(tar: tarfile.TarFile, rootfs: Path) -> None:
    members = tar.getmembers()
    for member in members:
        parent, _, base = member.name.lstrip("./").rpartition("/")
        if base == _OPAQUE:
            folder = rootfs / parent
            for child in folder.iterdir() if folder.is_dir() else ():
                remove(child)
        elif base.startswith(_WHITEOUT):
            remove(rootfs / parent / base.removeprefix(_WHITEOUT))
    for member in members:
        base = member.name.rpartition("/")[2]
        if base.startswith(_WHITEOUT):
            continue
        target = rootfs / member.name.lstrip("./")
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            target.unlink()
        tar.extract(member, rootfs, set_attrs=True, numeric_owner=True, filter="fully_trusted")


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        os.unlink(path)


def blob_path(digest: str) -> str:
    algorithm, _, value = digest.partition(":")
    return f"blobs/{algorithm}/{value}"


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    for candidate in (name, f"./{name}"):
        try:
            handle = tar.extractfile(candidate)
        except KeyError:
            continue
        if handle is not None:
            return handle.read()
    raise ArchiveError(f"{tar.name!s} has no {name}")


def _json_member(tar: tarfile.TarFile, name: str) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(_member(tar, name)))
