"""Images written as OCI archives: what ``ctr images import`` reads, reproducible."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from gpu_slicer.sandbox import oci_image

IMAGE = oci_image.ImageSpec("docker.io/library/tool:sandbox", entrypoint=["/bin/tool"])


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tool").write_bytes(b"#!/bin/sh\necho hi\n")
    (root / "bin" / "tool").chmod(0o755)
    (root / "bin" / "alias").symlink_to("tool")
    return root


def _read(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_the_archive_is_an_oci_layout_whose_blobs_match_their_digests(tmp_path: Path) -> None:
    files = _read(oci_image.write_archive(_root(tmp_path), IMAGE, tmp_path / "image.tar"))
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    [entry] = json.loads(files["index.json"])["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == IMAGE.name
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "sandbox"
    manifest = json.loads(files["blobs/sha256/" + entry["digest"].split(":")[1]])
    config = json.loads(files["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    [layer] = manifest["layers"]
    assert config["rootfs"]["diff_ids"] == [layer["digest"]]  # uncompressed: same digest
    assert config["config"]["Entrypoint"] == ["/bin/tool"]
    assert config["architecture"] == oci_image.architecture()


def test_the_layer_holds_the_folder_owned_by_root_with_modes_and_links(tmp_path: Path) -> None:
    files = _read(oci_image.write_archive(_root(tmp_path), IMAGE, tmp_path / "image.tar"))
    index = json.loads(files["index.json"])
    manifest = json.loads(files["blobs/sha256/" + index["manifests"][0]["digest"][7:]])
    layer = files["blobs/sha256/" + manifest["layers"][0]["digest"][7:]]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {"bin", "bin/tool", "bin/alias"}
        assert members["bin/tool"].mode & 0o777 == 0o755
        assert members["bin/alias"].issym() and members["bin/alias"].linkname == "tool"
        assert {(m.uid, m.gid, m.mtime) for m in members.values()} == {(0, 0, 0)}


def test_the_same_folder_gives_the_same_image(tmp_path: Path) -> None:
    root = _root(tmp_path)
    one = oci_image.write_archive(root, IMAGE, tmp_path / "one.tar")
    two = oci_image.write_archive(root, IMAGE, tmp_path / "two.tar")
    assert one.read_bytes() == two.read_bytes()
