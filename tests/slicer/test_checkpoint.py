"""The checkpoint file: round trip, checksum, version, atomic writes, recovery when corrupt."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from kube.memory import InMemoryKubeApi
from slicer.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    CheckpointStore,
    ClaimEntry,
    PreparedDevice,
    decode,
    encode,
)
from slicer.errors import CheckpointError
from slicer.simulated import SimulatedBackend
from tests.support.agent_fixtures import NODE, allocate_claim, build_agent, ref


def sample() -> Checkpoint:
    device = PreparedDevice(
        ("gpu",),
        "gpu-0-mig-1g10gb-6",
        0,
        "1g.10gb",
        6,
        3,
        0,
        "MIG-x",
        "k8s.gpu-slicer.io/claim=u1-gpu-0-mig-1g10gb-6",
    )
    whole = PreparedDevice(("a/b",), "gpu-1", 1, cdi_device_id="k8s.gpu-slicer.io/claim=u2-gpu-1")
    return Checkpoint(
        "boot-1",
        {
            "u1": ClaimEntry("u1", "ml", "c1", PREPARE_COMPLETED, 10.5, (device,)),
            "u2": ClaimEntry("u2", "ml", "c2", PREPARE_STARTED, 11.0, (whole,)),
        },
    )


def test_a_checkpoint_survives_encoding_unchanged() -> None:
    assert decode(encode(sample())) == sample()


def test_the_file_carries_version_checksum_and_boot_id() -> None:
    envelope = json.loads(encode(sample()))
    assert envelope["version"] == 1
    assert envelope["checksum"].startswith("sha256:")
    assert envelope["data"]["bootId"] == "boot-1"
    assert envelope["data"]["claims"]["u2"]["state"] == "PrepareStarted"


def test_a_changed_byte_fails_the_checksum() -> None:
    tampered = encode(sample()).replace(b'"giId":3', b'"giId":4')
    with pytest.raises(CheckpointError, match="checksum"):
        decode(tampered)


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"[]", b'{"version": 99, "data": {}}', b"\xff\xfe"],
    ids=["truncated", "array", "future", "binary"],
)
def test_unusable_files_raise_a_checkpoint_error(raw: bytes) -> None:
    with pytest.raises(CheckpointError):
        decode(raw)


def test_save_replaces_the_file_atomically_and_leaves_no_temp_files(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save(sample())
    store.save(Checkpoint("boot-2"))
    assert store.load() == Checkpoint("boot-2")
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.json"]


def test_a_failed_write_keeps_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(tmp_path)
    store.save(sample())

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        store.save(Checkpoint("boot-2"))
    monkeypatch.undo()
    assert store.load() == sample()
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.json"]


def test_a_corrupt_file_is_moved_aside_and_the_agent_starts_empty(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.path.write_bytes(b'{"version": 1, "checksum": "sha256:00", "data": {}}')
    checkpoint, problem = store.load_or_recover("boot-9")
    assert checkpoint == Checkpoint("boot-9")
    assert problem is not None and "checksum" in problem
    assert not store.path.exists()
    assert [p.name for p in tmp_path.iterdir()][0].startswith("checkpoint.json.corrupt-")


def test_a_corrupt_checkpoint_is_recovered_by_adopting_allocated_instances(tmp_path: Path) -> None:
    api = InMemoryKubeApi()
    backend = SimulatedBackend("H100-80GB:1", node_name=NODE)
    claim = allocate_claim(api, ["gpu-0-mig-2g20gb-2"])
    build_agent(backend, api, tmp_path).prepare(claim)
    (tmp_path / "checkpoint" / "checkpoint.json").write_text("garbage")
    agent = build_agent(backend, api, tmp_path)  # does not crash
    assert agent.metrics.value("gpu_slicer_agent_checkpoint_problems_total") == 1
    report = agent.reconcile()
    assert report.adopted == [ref(claim)[0]]
    assert report.foreign == []
    assert agent.unprepare(claim) is True  # the adopted instance is destroyed normally
    assert backend.instances(0) == []


def test_a_file_written_in_the_earlier_indented_layout_still_loads(tmp_path: Path) -> None:
    data = sample().to_json()
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    checksum = "sha256:" + hashlib.sha256(canonical).hexdigest()
    store = CheckpointStore(tmp_path)
    store.path.write_text(
        json.dumps({"version": 1, "checksum": checksum, "data": data}, indent=1, sort_keys=True)
    )
    assert store.load() == sample()


def test_reused_entry_text_gives_the_same_bytes_as_a_fresh_encoding() -> None:
    fragments: dict[str, tuple[ClaimEntry, str]] = {}
    checkpoint = sample()
    assert encode(checkpoint, fragments) == encode(checkpoint)
    started = ClaimEntry("u3", "ns", "c3", PREPARE_STARTED, 12.0, ())
    checkpoint = Checkpoint("boot-1", {**checkpoint.claims, "u3": started})
    assert encode(checkpoint, fragments) == encode(checkpoint)
    done = started.completed((PreparedDevice(("g",), "gpu-2", 2, uuid="GPU-2"),))
    checkpoint = Checkpoint("boot-1", {"u3": done, "u1": checkpoint.claims["u1"]})
    assert encode(checkpoint, fragments) == encode(checkpoint)
    assert decode(encode(checkpoint, fragments)) == checkpoint
    assert set(fragments) == {"u1", "u3"}  # text of forgotten entries is not kept


def _count_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return calls


def test_a_durable_save_fsyncs_file_and_directory_and_a_plain_one_neither(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(tmp_path)
    fsyncs = _count_fsyncs(monkeypatch)
    store.save(sample())
    assert len(fsyncs) == 2
    store.save(Checkpoint("boot-2"), durable=False)
    assert len(fsyncs) == 2
    assert store.load() == Checkpoint("boot-2")  # atomic and visible all the same
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.json"]


def test_a_prepare_makes_one_durable_write_before_the_gpu_and_one_plain_write_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = InMemoryKubeApi()
    backend = SimulatedBackend("H100-80GB:1", node_name=NODE, mig_enabled=True)
    agent = build_agent(backend, api, tmp_path)
    claim = allocate_claim(api, ["gpu-0-mig-1g10gb-3"])
    writes: list[tuple[str, bool, int]] = []
    save = agent.state.store.save

    def recording(checkpoint: Checkpoint, *, durable: bool = True) -> None:
        [entry] = checkpoint.claims.values()
        writes.append((entry.state, durable, len(backend.instances(0))))
        save(checkpoint, durable=durable)

    monkeypatch.setattr(agent.state.store, "save", recording)
    agent.prepare(claim)
    assert writes == [(PREPARE_STARTED, True, 0), (PREPARE_COMPLETED, False, 1)]
    agent.prepare(claim)  # answered from the checkpoint: nothing written again
    assert len(writes) == 2
