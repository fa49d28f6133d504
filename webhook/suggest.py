"""Suggestions for mistyped names: the nearest valid ones instead of every valid name.

A typo in a profile (``1g.10g``) or a GPU model (``A100-80``) used to be answered with the whole
catalog, dozens of names the reader had to scan. The nearest few (by ``difflib``'s similarity)
are what the person meant almost every time; when nothing is close, a short list is still shown
whole and a long one is named by where to find it.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

NEAREST = 3
"""At most this many suggestions."""
CUTOFF = 0.7
"""``difflib`` similarity a name needs to be suggested. Profile names are short and alike
(``9g.1tb`` is 0.62 from ``4g.71gb``), so this is above difflib's own 0.6."""
SPREAD = 0.1
"""Suggestions this much less similar than the best one are left out: ``1g.10g`` means
``1g.10gb`` (0.92), not ``2g.10gb`` (0.77)."""
SHORT_LIST = 16
"""A list of valid names this long or shorter is shown whole when nothing is close."""


def nearest(name: str, valid: Sequence[str], *, n: int = NEAREST) -> list[str]:
    """The names of ``valid`` closest to ``name``, closest first; case is ignored."""
    by_folded: dict[str, str] = {}
    for candidate in valid:
        by_folded.setdefault(candidate.lower(), candidate)
    folded_name = name.lower()
    started = [c for f, c in by_folded.items() if len(name) >= 3 and f.startswith(folded_name)]
    if started:  # ``h100`` means one of the H100 models, however far the ratio says they are
        return started[:n]
    matcher = difflib.SequenceMatcher(b=folded_name)
    scored: list[tuple[float, str]] = []
    for folded in by_folded:
        matcher.set_seq1(folded)
        ratio = matcher.ratio()
        if ratio >= CUTOFF:
            scored.append((ratio, folded))
    if not scored:
        return []
    scored.sort(key=lambda rs: (-rs[0], rs[1]))
    best = scored[0][0]
    return [by_folded[f] for r, f in scored[:n] if r >= best - SPREAD]


def did_you_mean(names: Sequence[str], valid: Sequence[str], *, where: str) -> str:
    """``did you mean '1g.10gb'?`` for each of ``names`` that has a near valid name; otherwise
    the valid names when few, else ``where`` (a command or key that lists them)."""
    hints: list[str] = []
    for name in names:
        close = [n for n in nearest(name, valid) if n != name]
        if close:
            options = " or ".join(repr(c) for c in close)
            prefix = f"{name!r}: " if len(names) > 1 else ""
            hints.append(f"{prefix}did you mean {options}?")
    if hints:
        return "; ".join(hints)
    if len(valid) <= SHORT_LIST:
        return "valid: " + ", ".join(valid)
    return f"none of the {len(valid)} valid names is close; {where} lists them"
