"""The agent's memory across restarts: which claims it prepared, and with which MIG instances.

The kubelet calls NodePrepareResources again after every restart of itself or the agent, and the
GPU keeps instances across agent restarts (not across reboots). The checkpoint is what lets the
agent answer those calls idempotently and tell its own instances from instances someone else
made. One JSON file, ``checkpoint.json`` in the checkpoint directory::

    {"version": 2,
     "writer": "gpu-slicer <release>",
     "checksum": "sha256:<hex of the canonical JSON of data>",
     "data": {"bootId": "...",
              "claims": {"<claim uid>": {"namespace": "...", "name": "...",
                                         "state": "PrepareStarted" | "PrepareCompleted",
                                         "startedAt": <unix seconds>,
                                         "devices": [PreparedDevice...]}}}}

A claim is recorded ``PrepareStarted`` (with the placements it is about to create) *before* the
GPU is touched and ``PrepareCompleted`` (with GI/CI ids and the MIG UUID) after; it is removed
only after its instances are gone. Writes go to a temporary file that is renamed over the old one,
so a crash leaves either the old or the new file, never half of one; durable writes also fsync the
file before and the directory after the rename (see :meth:`CheckpointStore.save` for which writes
need that). The file is compact canonical JSON, and each write serialises only the entries that
changed since the last one (the others' text is reused). A file that
cannot be read, fails its checksum or has an unknown version raises :class:`CheckpointError`
from :meth:`CheckpointStore.load`; :meth:`CheckpointStore.load_or_recover` moves it aside and
starts empty, and the reconciler then rebuilds state from the GPUs and the API.

Format versions (:data:`VERSION`; docs/agent.md, "Checkpoint format versions"): the agent reads
every version in :data:`READABLE_VERSIONS` and migrates it to the current one in memory (the next
write is in the current format). A file of a *newer* version is never moved aside, since it is
the only record of which MIG instances are the agent's: :class:`CheckpointTooNew` stops the agent
with a message naming both versions, the release that wrote the file and the documented way out.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any, Literal

from gpu_slicer.core.identity import LEGACY_DRIVERS
from gpu_slicer.kube.atomic_files import ensure_dir, write_atomically
from gpu_slicer.slicer.cdi import claim_uid_problem
from gpu_slicer.slicer.errors import CheckpointError, CheckpointTooNew

VERSION = 3
"""The newest format this agent writes.

1. The envelope ``{version, checksum, data}`` (the first release).
2. Adds ``writer``, the gpu-slicer release that wrote the file, so that an agent that cannot read
   a newer file names the release that can. ``data`` is unchanged.
3. A claim allocated under the driver name ``z.gpu-slicer.io`` (0.2) records it in its entry
   (``driver``); an entry without one was allocated under 0.1's ``gpu-slicer.io``. A file with
   no such claim is still written as format 2, which 0.1 reads. 0.1 refuses format 3 instead of
   reading it: it knows only ``gpu-slicer.io`` and would take such claims for released ones and
   destroy the MIG instances of their running pods.
"""
LEGACY_FORMAT = 2
"""What a file whose claims are all of 0.1's driver name is written as (0.1 reads it)."""
READABLE_VERSIONS = (1, 2, 3)
"""Every format this agent reads (and migrates to :data:`VERSION` in memory)."""
VERSIONS_DOC = "docs/agent.md, section 'Checkpoint format versions'"
FILENAME = "checkpoint.json"
DIR_MODE = 0o750
"""The checkpoint folder's mode (the agent's alone; set whatever the umask)."""
FILE_MODE = 0o600

PrepareState = Literal["PrepareStarted", "PrepareCompleted"]
PREPARE_STARTED: PrepareState = "PrepareStarted"
PREPARE_COMPLETED: PrepareState = "PrepareCompleted"


@dataclass(frozen=True)
class PreparedDevice:
    """One allocated device of a claim and, once created, the instance that backs it.

    ``profile``/``start`` are None for a whole GPU. ``gi_id``, ``ci_id`` and ``uuid`` are known
    only once the instance exists (always for PrepareCompleted MIG devices).
    """

    request_names: tuple[str, ...]
    device_name: str
    gpu_index: int
    profile: str | None = None
    start: int | None = None
    gi_id: int | None = None
    ci_id: int | None = None
    uuid: str | None = None
    cdi_device_id: str = ""
    provided: bool = False
    """The instance was there before the claim (a static layout's, made by mig-parted or by
    hand): the claim uses it and its release leaves it on the GPU."""

    @property
    def is_mig(self) -> bool:
        return self.profile is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "requestNames": list(self.request_names),
            "deviceName": self.device_name,
            "gpuIndex": self.gpu_index,
            "profile": self.profile,
            "start": self.start,
            "giId": self.gi_id,
            "ciId": self.ci_id,
            "uuid": self.uuid,
            "cdiDeviceId": self.cdi_device_id,
            **({"provided": True} if self.provided else {}),
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> PreparedDevice:
        return cls(
            request_names=tuple(str(n) for n in raw["requestNames"]),
            device_name=str(raw["deviceName"]),
            gpu_index=int(raw["gpuIndex"]),
            profile=_opt_str(raw.get("profile")),
            start=_opt_int(raw.get("start")),
            gi_id=_opt_int(raw.get("giId")),
            ci_id=_opt_int(raw.get("ciId")),
            uuid=_opt_str(raw.get("uuid")),
            cdi_device_id=str(raw.get("cdiDeviceId", "")),
            provided=bool(raw.get("provided", False)),
        )


@dataclass(frozen=True)
class ClaimEntry:
    """What the agent did (or started doing) for one claim."""

    uid: str
    namespace: str
    name: str
    state: PrepareState
    started_at: float
    devices: tuple[PreparedDevice, ...]
    driver: str = LEGACY_DRIVERS[0]
    """The driver name the claim was allocated under (format 3 records the current one)."""

    def completed(self, devices: tuple[PreparedDevice, ...]) -> ClaimEntry:
        return replace(self, state=PREPARE_COMPLETED, devices=devices)

    @property
    def needs_format_3(self) -> bool:
        return self.driver != LEGACY_DRIVERS[0]

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "namespace": self.namespace,
            "name": self.name,
            "state": self.state,
            "startedAt": self.started_at,
            "devices": [d.to_json() for d in self.devices],
        }
        if self.needs_format_3:
            data["driver"] = self.driver
        return data

    @classmethod
    def from_json(cls, uid: str, raw: dict[str, Any]) -> ClaimEntry:
        state = raw["state"]
        if state not in (PREPARE_STARTED, PREPARE_COMPLETED):
            raise ValueError(f"unknown claim state {state!r}")
        return cls(
            uid=uid,
            namespace=str(raw["namespace"]),
            name=str(raw["name"]),
            state=state,
            started_at=float(raw["startedAt"]),
            devices=tuple(PreparedDevice.from_json(d) for d in raw["devices"]),
            driver=str(raw.get("driver", LEGACY_DRIVERS[0])),
        )


@dataclass
class Checkpoint:
    """The whole file's data: the boot it belongs to and one entry per claim."""

    boot_id: str
    claims: dict[str, ClaimEntry] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "bootId": self.boot_id,
            "claims": {uid: e.to_json() for uid, e in sorted(self.claims.items())},
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Checkpoint:
        for uid in raw["claims"]:
            problem = claim_uid_problem(uid)
            if problem is not None:
                raise ValueError(problem)
        claims = {uid: ClaimEntry.from_json(uid, e) for uid, e in raw["claims"].items()}
        return cls(boot_id=str(raw["bootId"]), claims=claims)


def encode(
    checkpoint: Checkpoint, fragments: dict[str, tuple[ClaimEntry, str]] | None = None
) -> bytes:
    """The file's bytes: versioned envelope with a checksum over the canonical data.

    The data is serialised once, canonically (sorted keys, no spaces), and that text is both
    what the checksum covers and what the file holds. ``fragments`` (uid -> (entry, its canonical
    text)) lets a caller that writes often reuse the text of entries that did not change; it is
    updated in place. The result is the same bytes either way.
    """
    parts = []
    for uid in sorted(checkpoint.claims):
        entry = checkpoint.claims[uid]
        cached = fragments.get(uid) if fragments is not None else None
        if cached is not None and cached[0] is entry:
            text = cached[1]
        else:
            text = json.dumps(entry.to_json(), sort_keys=True, separators=(",", ":"))
            if fragments is not None:
                fragments[uid] = (entry, text)
        parts.append(f"{json.dumps(uid)}:{text}")
    if fragments is not None and len(fragments) > len(checkpoint.claims):
        for uid in [u for u in fragments if u not in checkpoint.claims]:
            del fragments[uid]
    canonical = (
        f'{{"bootId":{json.dumps(checkpoint.boot_id)},"claims":{{{",".join(parts)}}}}}'
    ).encode()
    checksum = "sha256:" + hashlib.sha256(canonical).hexdigest()
    return (
        b'{"checksum":"'
        + checksum.encode()
        + b'","data":'
        + canonical
        + (b',"version":' + str(format_for(checkpoint)).encode())
        + (b',"writer":' + json.dumps(writer()).encode() + b"}\n")
    )


@cache
def writer() -> str:
    """This agent's release, as the files it writes name it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"gpu-slicer {version('gpu-slicer')}"
    except PackageNotFoundError:  # a source tree that was never installed
        return "gpu-slicer (not installed)"


def format_for(checkpoint: Checkpoint) -> int:
    """The oldest format that holds ``checkpoint``: 3 once a claim of the current driver name
    is in it, else 2 (so that a rollback to 0.1 with no such claim needs nothing)."""
    if any(entry.needs_format_3 for entry in checkpoint.claims.values()):
        return VERSION
    return LEGACY_FORMAT


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    1: lambda data: data,  # 1 -> 2: the envelope gained ``writer``; the data is the same
    2: lambda data: data,  # 2 -> 3: entries without ``driver`` are 0.1's, as format 2's are
}
"""``MIGRATIONS[v]`` turns the data of format ``v`` into that of format ``v + 1``."""


def decode(raw: bytes, *, where: str = "checkpoint") -> Checkpoint:
    """Parse, verify and migrate a checkpoint file's bytes; CheckpointError says what is wrong,
    CheckpointTooNew that a newer agent wrote them."""
    try:
        envelope = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{where} is not valid JSON ({exc})") from exc
    if not isinstance(envelope, dict):
        raise CheckpointError(f"{where} is not a JSON object")
    version = envelope.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CheckpointError(f"{where} has no format version (version: {version!r})")
    readable = f"format version{'s' if len(READABLE_VERSIONS) > 1 else ''} " + ", ".join(
        map(str, READABLE_VERSIONS)
    )
    if version > VERSION:
        written = envelope.get("writer")
        by = written if isinstance(written, str) and written else "a newer gpu-slicer"
        raise CheckpointTooNew(
            f"{where} is format version {version}, written by {by}; this agent ({writer()}) "
            f"reads {readable}. It is left as it is: it records which MIG instances are "
            f"gpu-slicer's. Run {by} or newer on this node again, or roll back as "
            f"{VERSIONS_DOC} describes",
            version=version,
            writer=written if isinstance(written, str) else None,
        )
    if version not in READABLE_VERSIONS:
        raise CheckpointError(
            f"{where} is format version {version}, which this agent no longer reads ({readable})"
        )
    data = envelope.get("data")
    if not isinstance(data, dict) or envelope.get("checksum") != _checksum(data):
        raise CheckpointError(f"{where}: checksum does not match its data (corrupt file)")
    try:
        for step in range(version, VERSION):
            data = MIGRATIONS[step](data)
        return Checkpoint.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{where}: data is malformed ({exc!r})") from exc


class CheckpointStore:
    """Reads and atomically writes ``checkpoint.json`` in one directory."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.path = self.directory / FILENAME
        self._fragments: dict[str, tuple[ClaimEntry, str]] = {}
        self._dir_ready = False

    def load(self) -> Checkpoint | None:
        """The stored checkpoint, None when there is none; CheckpointError when unusable."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CheckpointError(f"cannot read checkpoint {self.path}: {exc}") from exc
        return decode(raw, where=f"checkpoint {self.path}")

    def load_or_recover(self, boot_id: str) -> tuple[Checkpoint, str | None]:
        """Load, or start empty when the file is unusable; returns (checkpoint, problem).

        An unusable file is renamed to ``checkpoint.json.corrupt-<unix time>`` (kept for
        a person to look at) so the agent does not trip over it again on the next start.
        """
        try:
            found = self.load()
        except CheckpointTooNew:
            raise  # the newer agent's record: never moved aside, never overwritten
        except CheckpointError as exc:
            aside = self.path.with_name(f"{FILENAME}.corrupt-{int(time.time())}")
            try:
                os.replace(self.path, aside)
            except OSError:
                pass
            return Checkpoint(boot_id=boot_id), f"{exc}; moved aside to {aside.name}"
        return (found or Checkpoint(boot_id=boot_id)), None

    def save(self, checkpoint: Checkpoint, *, durable: bool = True) -> None:
        """Write atomically: a temp file in the same directory renamed over the old file.

        ``durable`` (the default) also fsyncs the file before and the directory after the
        rename, so the new content survives a power loss: needed before the agent acts on what
        it records (PrepareStarted: the GPU is touched next; removals). A non-durable write is
        still atomic for every reader, and visible to a restarted agent (a process crash loses
        nothing that reached the page cache); only an OS crash can lose it, and that is a reboot,
        after which the agent clears every entry anyway (the boot id changed, no MIG instance
        survived). The agent uses it for PrepareCompleted; see docs/agent.md.
        """
        payload = encode(checkpoint, self._fragments)
        if not self._dir_ready:
            ensure_dir(self.directory, DIR_MODE, own=True)
            self._dir_ready = True
        try:
            write_atomically(self.path, payload, mode=FILE_MODE, durable=durable)
        except FileNotFoundError:  # the directory was removed under us: make it again, once
            ensure_dir(self.directory, DIR_MODE, own=True)
            write_atomically(self.path, payload, mode=FILE_MODE, durable=durable)


def _checksum(data: dict[str, Any]) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)
