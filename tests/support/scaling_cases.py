"""The cases of the quadratic-scheduling note that the agent, ``status`` and ``plan`` give."""

from __future__ import annotations

RELEASES = [((1, 36), True), ((1, 37), False)]
"""(release, whether the note is expected): 1.36 lacks the scheduler fix, 1.37 has it."""


def check_note(notes: list[str], *, warned: bool, nodes: int) -> None:
    """Exactly one note on a release without the fix, naming the GPU node count, the fixed
    release and the agent setting; none otherwise."""
    found = [n for n in notes if "square of the nodes" in n]
    assert len(found) == (1 if warned else 0), notes
    if warned:
        assert f"({nodes} GPU nodes here)" in found[0]
        assert "fixed in 1.37" in found[0] and "--advertise static" in found[0]
