"""``slices -o yaml`` writes with libyaml's emitter where PyYAML has it: the same text."""

from __future__ import annotations

import pytest
import yaml

from gpu_slicer.slicer.cli import YAML_DUMPER
from gpu_slicer.slicer.deviceclasses import device_classes
from gpu_slicer.slicer.inventory import GpuState, plan_pool
from gpu_slicer.slicer.simulated import SimulatedBackend


@pytest.mark.skipif(not hasattr(yaml, "CSafeDumper"), reason="PyYAML built without libyaml")
@pytest.mark.parametrize("version", [(1, 34), (1, 36)])
def test_the_c_emitter_writes_what_the_python_emitter_writes(version: tuple[int, int]) -> None:
    states = [
        GpuState(g) for g in SimulatedBackend("H100-80GB:2,A100-80GB:1", node_name="n").gpus()
    ]
    objects = device_classes(extended_resources=True) + list(
        plan_pool("n", states, server_version=version, device_order="best-fit").slices
    )
    assert YAML_DUMPER.__name__ == "CSafeDumper"
    fast = yaml.dump_all(objects, Dumper=YAML_DUMPER, sort_keys=False)
    assert fast == yaml.dump_all(objects, Dumper=yaml.SafeDumper, sort_keys=False)
    assert list(yaml.safe_load_all(fast)) == objects
