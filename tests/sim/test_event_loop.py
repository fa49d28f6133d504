"""The engine's ledger of each GPU: what the slots held on it decide follows every change; and
a run leaves the garbage collector as it found it."""

from __future__ import annotations

import gc

import pytest

from gpu_slicer.core import catalog
from gpu_slicer.sim.event_loop import GpuLedger, Slot, _collector_off


def test_a_gpus_ledger_follows_each_pod_held_and_dropped() -> None:
    ledger = GpuLedger("n1", 0, catalog.get_model("A100-80GB"))
    assert (ledger.placements(), ledger.whole, ledger.used_slices()) == ((), False, 0)
    ledger.hold("a", [Slot(0, "3g.40gb", 4)])
    ledger.hold("b", [Slot(0, "1g.10gb", 0), Slot(0, "1g.10gb", 1)])
    assert ledger.placements() == (("1g.10gb", 0), ("1g.10gb", 1), ("3g.40gb", 4))
    assert (ledger.whole, ledger.used_slices()) == (False, 6)
    ledger.drop("a")
    assert (ledger.placements(), ledger.used_slices()) == ((("1g.10gb", 0), ("1g.10gb", 1)), 2)
    ledger.drop("a")  # dropping what is not held changes nothing
    ledger.drop("b")
    ledger.hold("c", [Slot(0, None)])
    assert (ledger.placements(), ledger.whole, ledger.used_slices()) == ((), True, 8)
    ledger.drop("c")
    assert (ledger.held, ledger.whole, ledger.used_slices()) == ({}, False, 0)


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_off_during_a_run_and_as_it_was_after(enabled: bool) -> None:
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        with _collector_off():
            assert not gc.isenabled()
            made = [[n] for n in range(1000)]
        assert gc.isenabled() is enabled
        # What the run made joined the oldest generation: no collection of it falls due at once.
        assert gc.get_count()[0] < 100 and all(gc.is_tracked(m) for m in made)
    finally:
        (gc.enable if was else gc.disable)()
