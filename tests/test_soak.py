"""A short soak (a few seconds, loopback): admissions while webhook workers are killed, prepares
while the agent restarts. The figures of a longer run come from ``python bench/soak.py``."""

from __future__ import annotations

from bench.soak import soak


def test_killed_workers_and_a_restarted_agent_lose_nothing() -> None:
    figures = soak(5.0, workers=2, clients=2, kill_every_s=1.0, restart_every_s=1.5, min_faults=2)
    assert figures.worker_kills >= 2 and figures.agent_restarts >= 2  # the faults happened
    assert figures.admissions_ok > 0 and figures.prepares_ok > 0
    assert figures.failed_other == 0, figures.problems
    assert figures.lost_claims == 0, figures.problems
    assert figures.prepares_ok == figures.unprepares_ok  # every cycle ends before the stop
    assert (
        figures.leaked_instances,
        figures.leftover_checkpoint_entries,
        figures.leftover_cdi_specs,
    ) == (0, 0, 0)
