"""Under ``umask 000`` the agent's sockets, folders and files get the modes it sets, not the
umask's: before, the sockets were world-writable (``srwxrwxrwx``), the checkpoint and CDI
folders 0777 and ``agent.lock`` 0666."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.slicer import agent_lock
from gpu_slicer.slicer.agent import NodeAgent
from gpu_slicer.slicer.backend import HealthEvent
from gpu_slicer.slicer.cdi import CdiDirectory, DeviceEdits
from gpu_slicer.slicer.proto import dra_v1_pb2, dra_v1_pb2_grpc
from gpu_slicer.slicer.simulated import SimulatedBackend
from gpu_slicer.slicer.simulated_store import events_dir, queue_event
from tests.support.agent_fixtures import NODE, agent_config, allocate_claim, ref


@pytest.fixture
def umask_000() -> Iterator[None]:
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))  # unix socket paths must be short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_every_socket_folder_and_file_of_the_agent_has_its_own_mode_under_umask_000(
    umask_000: None, root: Path
) -> None:
    config = agent_config(root)
    lock = agent_lock.acquire(config.checkpoint_dir)
    api = InMemoryKubeApi()
    agent = NodeAgent(config, backend=SimulatedBackend("H100-80GB:1", node_name=NODE), api=api)
    agent.start()
    try:
        claim = allocate_claim(api, ["gpu-0-mig-1g10gb-0"])
        uid, namespace, name = ref(claim)
        with grpc.insecure_channel(f"unix://{agent.plugin.dra_path}") as channel:
            answer = dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(
                    claims=[dra_v1_pb2.Claim(namespace=namespace, uid=uid, name=name)]
                ),
                timeout=30,
            )
        assert answer.claims[uid].error == ""
        found = {
            "DRA socket": mode(agent.plugin.dra_path),
            "registration socket": mode(agent.plugin.registration_path),
            "DRA socket folder": mode(agent.plugin.dra_path.parent),
            "registry folder (created)": mode(config.registry_dir),
            "checkpoint folder": mode(config.checkpoint_dir),
            "checkpoint": mode(config.checkpoint_dir / "checkpoint.json"),
            "agent.lock": mode(config.checkpoint_dir / "agent.lock"),
            "CDI folder (created)": mode(config.cdi_dir),
            "CDI spec": mode(agent.state.cdi.path_for(uid)),
        }
    finally:
        agent.stop()
        api.close()
        lock.release()
    assert found == {
        "DRA socket": 0o600,
        "registration socket": 0o600,
        "DRA socket folder": 0o750,
        "registry folder (created)": 0o750,
        "checkpoint folder": 0o750,
        "checkpoint": 0o600,
        "agent.lock": 0o644,
        "CDI folder (created)": 0o755,
        "CDI spec": 0o644,
    }


def test_the_agents_own_folders_and_lock_are_tightened_a_shared_folder_is_left_alone(
    umask_000: None, root: Path
) -> None:
    checkpoint_dir, cdi_dir = root / "ckpt", root / "cdi"
    checkpoint_dir.mkdir(0o777)
    cdi_dir.mkdir(0o777)  # the toolkit's or an admin's: not the agent's to change
    (checkpoint_dir / "agent.lock").write_text("")
    os.chmod(checkpoint_dir / "agent.lock", 0o666)
    agent_lock.acquire(checkpoint_dir).release()
    assert mode(checkpoint_dir) == 0o750
    assert mode(checkpoint_dir / "agent.lock") == 0o644
    CdiDirectory(cdi_dir).write("u-1", [DeviceEdits("gpu-0", 0, "GPU-0")])
    assert mode(cdi_dir) == 0o777


def test_the_simulated_event_inbox_is_not_world_writable_under_umask_000(
    umask_000: None, root: Path
) -> None:
    state = root / "nodes" / "n1" / "gpus.json"
    queued = queue_event(state, HealthEvent(0, "gpu-lost"))
    assert mode(events_dir(state)) == 0o750
    assert mode(queued) & 0o022 == 0
