"""The checkpoint file: round trip, checksum, version, atomic writes, recovery when corrupt."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from gpu_slicer.core.identity import DRIVER, LEGACY_DRIVERS
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.slicer.checkpoint import (
    LEGACY_FORMAT,
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    READABLE_VERSIONS,
    VERSION,
    Checkpoint,
    CheckpointStore,
    ClaimEntry,
    PreparedDevice,
    decode,
    encode,
    writer,
)
from gpu_slicer.slicer.errors import CheckpointError, CheckpointTooNew
from gpu_slicer.slicer.simulated import SimulatedBackend
from tests.support.agent_fixtures import NODE, allocate_claim, build_agent, ref
from tests.support.previous_formats import (
    CHECKPOINT_V1_FILE,
    checkpoint_from_the_future,
    checkpoint_v1,
    write_checkpoint_v1,
)


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


def test_the_file_carries_version_writer_checksum_and_boot_id() -> None:
    envelope = json.loads(encode(sample()))
    assert envelope["version"] == LEGACY_FORMAT == 2  # its claims are all of 0.1's driver name
    assert envelope["writer"].startswith("gpu-slicer ")
    assert envelope["checksum"].startswith("sha256:")
    assert envelope["data"]["bootId"] == "boot-1"
    assert envelope["data"]["claims"]["u2"]["state"] == "PrepareStarted"


def test_a_claim_of_the_current_driver_name_makes_the_file_format_3() -> None:
    """Format 3, which 0.1 refuses: it would take such a claim for a released one."""
    checkpoint = sample()
    entry = checkpoint.claims["u1"]
    checkpoint.claims["u1"] = replace(entry, driver=DRIVER)
    envelope = json.loads(encode(checkpoint))
    assert envelope["version"] == VERSION == 3
    assert envelope["data"]["claims"]["u1"]["driver"] == DRIVER
    assert "driver" not in envelope["data"]["claims"]["u2"]
    assert decode(encode(checkpoint)) == checkpoint
    assert decode(encode(sample())).claims["u2"].driver == LEGACY_DRIVERS[0]


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


# --- format versions: what earlier releases wrote is read, a newer release's file refused ------


def test_the_format_1_fixture_writes_what_the_format_1_agent_wrote() -> None:
    committed = CHECKPOINT_V1_FILE.read_bytes()  # written by the format-1 agent itself
    assert checkpoint_v1(decode(committed)) == committed
    assert json.loads(committed)["version"] == 1
    assert "writer" not in json.loads(committed)


def test_every_entry_of_a_format_1_file_is_read_as_it_was_written() -> None:
    found = decode(CHECKPOINT_V1_FILE.read_bytes())
    assert READABLE_VERSIONS == (1, 2, 3)
    assert found.boot_id == "boot-v1"
    entries = {e.name: e for e in found.claims.values()}
    assert set(entries) == {
        "train-gpu-slicer-x7k2p",
        "lent-gpu-slicer-a1b2c",
        "crashed-gpu-slicer-q9w8e",
        "whole-gpu-slicer-z1x2c",
    }
    (train,) = entries["train-gpu-slicer-x7k2p"].devices
    assert (train.profile, train.start, train.gi_id, train.ci_id) == ("1g.10gb", 6, 5, 0)
    assert entries["lent-gpu-slicer-a1b2c"].devices[0].provided
    assert entries["lent-gpu-slicer-a1b2c"].devices[0].request_names == ("a", "b")
    assert entries["crashed-gpu-slicer-q9w8e"].state == PREPARE_STARTED
    assert entries["crashed-gpu-slicer-q9w8e"].devices[0].gi_id is None
    whole = entries["whole-gpu-slicer-z1x2c"]
    assert (whole.namespace, whole.devices[0].profile, whole.devices[0].uuid) == (
        "batch",
        None,
        "GPU-5b1f6c1e-0f2d-4c3b-9a8e-7d6c5b4a3f21",
    )


def test_an_agent_takes_over_the_checkpoint_a_format_1_agent_left_and_writes_format_2(
    tmp_path: Path,
) -> None:
    api = InMemoryKubeApi()
    backend = SimulatedBackend("H100-80GB:1", node_name=NODE)
    claim = allocate_claim(api, ["gpu-0-mig-2g20gb-2"], driver=LEGACY_DRIVERS[0])
    build_agent(backend, api, tmp_path).prepare(claim)
    folder = tmp_path / "checkpoint"
    left = CheckpointStore(folder).load()
    assert left is not None
    path = write_checkpoint_v1(folder, left)  # as the previous release left it on the node

    agent = build_agent(backend, api, tmp_path)
    assert agent.metrics.value("gpu_slicer_agent_checkpoint_problems_total") == 0
    assert agent.state.entries()[ref(claim)[0]].state == PREPARE_COMPLETED
    report = agent.reconcile()
    assert report.adopted == [] and report.foreign == []  # its own instance, from the file
    assert [d.device_name for d in agent.prepare(claim)] == ["gpu-0-mig-2g20gb-2"]
    assert len(backend.instances(0)) == 1  # answered from the checkpoint: nothing new made
    assert agent.unprepare(claim) is True
    assert backend.instances(0) == []
    envelope = json.loads(path.read_bytes())
    assert (envelope["version"], envelope["writer"]) == (2, writer())


def test_a_file_of_a_newer_format_is_refused_naming_versions_writer_and_the_way_out(
    tmp_path: Path,
) -> None:
    store = CheckpointStore(tmp_path)
    raw = checkpoint_from_the_future(4, writer="gpu-slicer 0.9.0")
    store.path.write_bytes(raw)
    with pytest.raises(CheckpointTooNew) as refused:
        store.load_or_recover("boot-1")
    message = str(refused.value)
    assert f"checkpoint {store.path} is format version 4, written by gpu-slicer 0.9.0" in message
    assert "reads format versions 1, 2, 3" in message
    assert "Run gpu-slicer 0.9.0 or newer on this node again" in message
    assert "docs/agent.md, section 'Checkpoint format versions'" in message
    assert (refused.value.version, refused.value.writer) == (4, "gpu-slicer 0.9.0")
    assert store.path.read_bytes() == raw  # left as it is: not moved aside, not rewritten
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]


def test_an_agent_does_not_start_on_a_newer_format_and_says_why(tmp_path: Path) -> None:
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "checkpoint.json").write_bytes(checkpoint_from_the_future(7))
    with pytest.raises(CheckpointTooNew, match="format version 7, written by gpu-slicer 9.0.0"):
        build_agent(SimulatedBackend("H100-80GB:1", node_name=NODE), InMemoryKubeApi(), tmp_path)


@pytest.mark.parametrize("version", [0, -1, "2", None, True, 1.5])
def test_a_file_without_a_format_version_is_corrupt_and_moved_aside(
    tmp_path: Path, version: object
) -> None:
    store = CheckpointStore(tmp_path)
    store.path.write_text(json.dumps({"version": version, "checksum": "x", "data": {}}))
    checkpoint, problem = store.load_or_recover("boot-1")
    assert checkpoint == Checkpoint("boot-1")
    assert problem is not None and "has no format version" in problem


def test_a_claim_uid_in_the_file_that_could_name_another_path_makes_it_corrupt() -> None:
    data = sample().to_json()
    data["claims"]["../../etc/x"] = data["claims"].pop("u1")
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    checksum = "sha256:" + hashlib.sha256(canonical).hexdigest()
    raw = json.dumps({"version": 2, "checksum": checksum, "data": data}).encode()
    with pytest.raises(CheckpointError, match="is not a Kubernetes UID"):
        decode(raw)
