"""Files as earlier releases of gpu-slicer wrote them, for the tests that the current one reads
them (upgrades) or refuses them with a way out (files from a newer release, rollbacks).

Each writer here is frozen: it is the earlier release's code, not a call into the current one,
so that a change of the current format cannot change what these files look like.
``tests/slicer/data/checkpoint-v1.json`` was written by the format-1 agent itself; a test checks
that :func:`checkpoint_v1` gives the same bytes for the same data.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from gpu_slicer.slicer.checkpoint import Checkpoint

CHECKPOINT_V1_FILE = Path(__file__).resolve().parents[1] / "slicer" / "data" / "checkpoint-v1.json"


def checkpoint_v1(checkpoint: Checkpoint) -> bytes:
    """``checkpoint.json`` as format 1 wrote it: ``{checksum, data, version: 1}``, compact
    canonical JSON, the checksum over the text of ``data``, no ``writer``."""
    canonical = json.dumps(checkpoint.to_json(), sort_keys=True, separators=(",", ":")).encode()
    checksum = "sha256:" + hashlib.sha256(canonical).hexdigest()
    return b'{"checksum":"' + checksum.encode() + b'","data":' + canonical + b',"version":1}\n'


def write_checkpoint_v1(folder: Path, checkpoint: Checkpoint) -> Path:
    """Leave ``checkpoint`` in ``folder`` as a format-1 agent would have."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "checkpoint.json"
    path.write_bytes(checkpoint_v1(checkpoint))
    return path


def checkpoint_from_the_future(version: int, writer: str = "gpu-slicer 9.0.0") -> bytes:
    """A file of a format this agent does not know, as a newer release might write it."""
    data = {"bootId": "b", "claims": {}, "somethingNew": True}
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    checksum = "sha256:" + hashlib.sha256(canonical).hexdigest()
    return json.dumps(
        {"checksum": checksum, "data": data, "version": version, "writer": writer}
    ).encode()
