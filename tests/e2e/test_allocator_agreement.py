"""The simulator's allocator model decides as the real kube-scheduler does (noon-burst replay).

The replay (bench/bench_allocator_agreement.py) starts its own sandbox, creates each claim of
the noon-burst scenario in turn, asks sim.allocator the same question on the same slices, and
exits 0 only when every step agrees on the subrequest and the devices (docs/simulator.md). The
mixed set of 126 steps takes minutes and is run by hand.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from gpu_slicer.sandbox import binaries

ROOT = Path(__file__).resolve().parents[2]


def test_the_model_agrees_with_the_real_scheduler_on_every_noon_burst_step(
    kube_binaries: binaries.Binaries,
) -> None:
    folder = Path(tempfile.mkdtemp(prefix="gs-agr-"))
    steps = folder / "steps.json"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "bench_allocator_agreement.py"),
            "--only",
            "noon-burst",
            "--state-dir",
            str(folder / "sb"),
            "--json",
            str(steps),
            "--timeout",
            "300",
        ],
        capture_output=True,
        text=True,
        timeout=420,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    recorded = json.loads(steps.read_text())["noon-burst"]
    assert len(recorded) >= 13
    assert all(step["agrees"] for step in recorded)
    allocated = [s for s in recorded if s["scheduler"]["status"] == "allocated"]
    assert len(allocated) >= 10  # the replay exercised real allocations, not only refusals
