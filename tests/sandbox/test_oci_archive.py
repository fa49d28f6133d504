"""OCI archives: a layout named for containerd, packed, read back and unpacked with whiteouts."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from gpu_slicer.sandbox import oci_archive


def _tar(entries: dict[str, bytes | None]) -> bytes:
    """A layer: name -> file content, or None for a folder."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, content in entries.items():
            info = tarfile.TarInfo(name)
            if content is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            else:
                info.size = len(content)
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def _blob(layout: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return f"sha256:{digest}"


def _layout(tmp: Path, layers: list[bytes]) -> Path:
    layout = tmp / "layout"
    config = {"config": {"User": "65532:65532", "Entrypoint": ["tool"]}, "rootfs": {}}
    config_digest = _blob(layout, json.dumps(config).encode())
    manifest = {
        "schemaVersion": 2,
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": _blob(layout, gz),
            }
            for gz in (gzip.compress(layer) for layer in layers)
        ],
    }
    manifest_digest = _blob(layout, json.dumps(manifest).encode())
    index = {
        "schemaVersion": 2,
        "manifests": [{"digest": manifest_digest, "annotations": {oci_archive.REF_NAME: "x:1"}}],
    }
    (layout / "index.json").write_text(json.dumps(index))
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return layout


def test_a_named_and_packed_layout_reads_back(tmp_path: Path) -> None:
    layout = _layout(tmp_path, [_tar({"etc": None, "etc/hello": b"hi"})])
    oci_archive.name_layout(layout, "docker.io/library/tool:1")
    archive = tmp_path / "tool.oci.tar"
    oci_archive.pack_layout(layout, archive)

    image = oci_archive.read_image(archive)
    assert image.name == "docker.io/library/tool:1"
    assert image.config["config"]["User"] == "65532:65532"
    with tarfile.open(archive) as tar:
        assert {member.uid for member in tar.getmembers()} == {0}
        assert "oci-layout" in tar.getnames()


def test_unpack_applies_layers_in_order_with_whiteouts(tmp_path: Path) -> None:
    lower = _tar(
        {
            "app": None,
            "app/kept": b"1",
            "app/replaced": b"old",
            "app/gone": b"x",
            "cache": None,
            "cache/a": b"a",
        }
    )
    upper = _tar(
        {
            "app": None,
            "app/replaced": b"new",
            "app/.wh.gone": b"",
            "cache": None,
            "cache/.wh..wh..opq": b"",
            "cache/b": b"b",
        }
    )
    archive = tmp_path / "a.oci.tar"
    oci_archive.pack_layout(_layout(tmp_path, [lower, upper]), archive)

    root = tmp_path / "rootfs"
    oci_archive.unpack(archive, root)
    assert (root / "app/kept").read_bytes() == b"1"
    assert (root / "app/replaced").read_bytes() == b"new"
    assert not (root / "app/gone").exists()
    assert sorted(path.name for path in (root / "cache").iterdir()) == ["b"]
    assert not any(path.name.startswith(".wh.") for path in root.rglob("*"))


def test_a_layout_with_two_images_is_refused(tmp_path: Path) -> None:
    layout = _layout(tmp_path, [_tar({"a": b"1"})])
    index = json.loads((layout / "index.json").read_text())
    index["manifests"].append(index["manifests"][0])
    (layout / "index.json").write_text(json.dumps(index))
    with pytest.raises(oci_archive.ArchiveError, match="2 images"):
        oci_archive.name_layout(layout, "docker.io/library/tool:1")


def test_a_missing_blob_is_named(tmp_path: Path) -> None:
    layout = _layout(tmp_path, [_tar({"a": b"1"})])
    index = json.loads((layout / "index.json").read_text())
    manifest_blob = layout / oci_archive.blob_path(index["manifests"][0]["digest"])
    manifest = json.loads(manifest_blob.read_text())
    (layout / oci_archive.blob_path(manifest["config"]["digest"])).unlink()
    archive = tmp_path / "broken.oci.tar"
    oci_archive.pack_layout(layout, archive)
    with pytest.raises(oci_archive.ArchiveError, match="has no blobs/sha256/"):
        oci_archive.read_image(archive)
