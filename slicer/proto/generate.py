"""Regenerate the Python code of the kubelet plugin protocols from the ``.proto`` files here.

The generated ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` are committed so that a node needs
no protobuf compiler; ``tests/slicer/test_proto_generated.py`` checks they match a fresh run.
The generator stamps its own version into the ``*_pb2_grpc.py`` files, so the test extra pins
grpcio-tools to the one version that wrote them (pyproject.toml): a newer release on the index
would otherwise fail that check on a fresh machine. Move the pin and the files together.

    python -m gpu_slicer.slicer.proto.generate            # rewrite the files in place
    python -m gpu_slicer.slicer.proto.generate --out DIR  # write the tree under DIR (the test)

Imports in the generated code are package-absolute (``from gpu_slicer.slicer.proto import``):
protoc runs with the repository root as the include path, on the files through ``gpu_slicer/``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROTO_DIR.parents[1]
PROTOS = (
    "pluginregistration.proto",
    "dra_v1.proto",
    "dra_v1beta1.proto",
    "dra_health_v1alpha1.proto",
)


def generate(out_root: Path) -> list[Path]:
    """Run protoc for every proto into ``out_root`` (mirroring ``gpu_slicer/slicer/proto``);
    list the files."""
    from grpc_tools import protoc  # build-time only: not needed on a node

    target = out_root / "gpu_slicer" / "slicer" / "proto"
    target.mkdir(parents=True, exist_ok=True)
    include = str(Path(protoc.__file__).resolve().parent / "_proto")
    for proto in PROTOS:
        args = [
            "grpc_tools.protoc",
            f"-I{REPO_ROOT}",
            f"-I{include}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            str(Path("gpu_slicer") / "slicer" / "proto" / proto),
        ]
        code = protoc.main(args)
        if code != 0:
            raise RuntimeError(f"protoc failed on {proto} with exit code {code}")
    return sorted(p for p in target.iterdir() if "_pb2" in p.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="root of the output tree")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
