"""Container images for the real node, written locally and imported into its containerd.

The real node pulls nothing: its sandbox (pause) image and the busybox image the tests run are
made here, each as an OCI image layout (``oci-layout``, ``index.json`` naming the image in the
``io.containerd.image.name`` annotation, content-addressed blobs) packed in one tar, and imported
with ``ctr -n k8s.io images import``. :func:`import_archive` takes any such archive (a
``buildah push ... oci-archive:`` of the project's image as well); for a running sandbox::

    python3 -m sandbox.oci_image --state-dir /tmp/sb --node real image.tar

Writing an archive is deterministic (sorted entries, owner root, time 0): the same folder gives
the same image digest.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import platform
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_slicer.sandbox.errors import StartupError

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar"
NAMESPACE = "k8s.io"
"""The containerd namespace the CRI plugin (and so the kubelet) uses."""

_ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


@dataclass(frozen=True)
class ImageSpec:
    """What a container of the image runs and with which environment."""

    name: str
    """Fully qualified reference, e.g. ``docker.io/library/busybox:sandbox``."""
    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    env: Sequence[str] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
    labels: dict[str, str] = field(default_factory=dict)


def architecture() -> str:
    """This machine's architecture as OCI names it."""
    machine = platform.machine()
    return _ARCHITECTURES.get(machine, machine)


def layer_tar(root: Path) -> bytes:
    """An uncompressed layer of everything under ``root``, reproducible byte for byte."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            if info.isfile():
                with open(path, "rb") as handle:
                    tar.addfile(info, handle)
            else:
                tar.addfile(info)
    return buffer.getvalue()


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def layout_files(root: Path, image: ImageSpec) -> dict[str, bytes]:
    """The image's OCI layout as ``{path in the layout: bytes}``: one layer of ``root``."""
    layer_digest, layer = _blob(layer_tar(root))
    arch = architecture()
    config_digest, config = _blob(
        _json(
            {
                "architecture": arch,
                "os": "linux",
                "config": {
                    "Entrypoint": list(image.entrypoint) or None,
                    "Cmd": list(image.cmd) or None,
                    "Env": list(image.env),
                    "Labels": image.labels or None,
                },
                "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
            }
        )
    )
    manifest_digest, manifest = _blob(
        _json(
            {
                "schemaVersion": 2,
                "mediaType": MANIFEST,
                "config": {"mediaType": CONFIG, "digest": config_digest, "size": len(config)},
                "layers": [{"mediaType": LAYER, "digest": layer_digest, "size": len(layer)}],
            }
        )
    )
    tag = image.name.rsplit(":", 1)[1] if ":" in image.name.rsplit("/", 1)[-1] else "latest"
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": INDEX,
            "manifests": [
                {
                    "mediaType": MANIFEST,
                    "digest": manifest_digest,
                    "size": len(manifest),
                    "platform": {"architecture": arch, "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": image.name,
                        "org.opencontainers.image.ref.name": tag,
                    },
                }
            ],
        }
    )
    files = {"oci-layout": _json({"imageLayoutVersion": "1.0.0"}), "index.json": index}
    for digest, data in (
        (layer_digest, layer),
        (config_digest, config),
        (manifest_digest, manifest),
    ):
        files["blobs/sha256/" + digest.removeprefix("sha256:")] = data
    return files


def write_archive(root: Path, image: ImageSpec, out: Path) -> Path:
    """``root`` as a one-layer image in an OCI archive at ``out`` (what ``ctr import`` takes)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    temp = out.with_name(f".{out.name}.tmp")
    with tarfile.open(temp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(layout_files(root, image).items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    temp.replace(out)
    return out


def import_archive(ctr: Path, address: Path, archive: Path, *, timeout_s: float = 120) -> str:
    """Imports an OCI (or Docker) image archive into containerd's CRI namespace; returns
    ctr's report. The kubelet then finds the image without pulling it."""
    command = [
        str(ctr),
        "--address",
        str(address),
        "--namespace",
        NAMESPACE,
        "images",
        "import",
        "--platform",
        f"linux/{architecture()}",
        str(archive),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise StartupError(
            f"ctr images import {archive} failed (exit {done.returncode}): "
            f"{done.stderr.strip()[-1000:]}"
        )
    return done.stdout


def import_into_sandbox(state_dir: Path, node: str, archive: Path) -> str:
    """Imports ``archive`` into the containerd of a running sandbox's real node ``node``."""
    from gpu_slicer.sandbox.binaries import ensure_containerd

    ready = json.loads((state_dir / "ready").read_text())
    entry = ready["nodes"].get(node) or {}
    if "containerdAddress" not in entry:
        raise StartupError(f"node {node!r} of {state_dir} is not a real node (--real-node)")
    ctr = ensure_containerd() / "ctr"
    return import_archive(ctr, Path(entry["containerdAddress"]), archive)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m sandbox.oci_image",
        description="import an OCI or Docker image archive into a sandbox's real node",
    )
    parser.add_argument("--state-dir", type=Path, required=True, metavar="DIR")
    parser.add_argument("--node", required=True, metavar="NAME")
    parser.add_argument("archive", type=Path)
    args = parser.parse_args(argv)
    try:
        print(import_into_sandbox(args.state_dir, args.node, args.archive), end="")
    except (OSError, KeyError, ValueError, StartupError) as exc:
        print(f"sandbox.oci_image: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
