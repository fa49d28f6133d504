"""Run last (file order): nothing the project sent was refused by the real apiserver."""

from __future__ import annotations

import re

from tests.support.e2e_sandbox import NODES, Sandbox

REFUSALS = re.compile(r"is invalid|Unprocessable|\b422\b|Invalid value|strict decoding error")


def test_no_component_logged_a_validation_error_from_the_apiserver(sandbox: Sandbox) -> None:
    for component in ["webhook", *(f"agent-{node}" for node in NODES)]:
        found = [line for line in sandbox.log(component).splitlines() if REFUSALS.search(line)]
        assert not found, f"{component}: {found[:3]}"


def test_the_kubelet_stand_ins_saw_no_cdi_or_unprepare_failure(sandbox: Sandbox) -> None:
    out = (sandbox.dir.parent / f"{sandbox.dir.name}.out").read_text(errors="replace")
    assert "CDI injection" not in out
    assert "NodeUnprepareResources of claim" not in out
