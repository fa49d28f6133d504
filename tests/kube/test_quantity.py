"""Quantities: device counts read the way the general quantity parser reads them."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_slicer.kube.quantity import (
    QuantityError,
    exact_value,
    format_bytes,
    parse_bytes,
    parse_count,
    parse_quantity,
)


def count_by_the_general_parser(value: object) -> int:
    """A count as the quantity grammar defines it (parse_count takes shortcuts for plain
    digits and ints; they must agree with this)."""
    amount = parse_quantity(value)
    if amount.denominator != 1 or amount < 0:
        raise QuantityError(f"{value!r} is not a whole, non-negative number of devices")
    return int(amount)


def outcome(parse: Callable[[object], int], value: object) -> tuple[str, object]:
    try:
        return ("ok", parse(value))
    except QuantityError as exc:
        return ("error", str(exc))


counts = st.one_of(
    st.from_regex(r"[0-9]{1,70}", fullmatch=True),
    st.integers(min_value=-5, max_value=2**40),
    st.booleans(),
    st.sampled_from(
        [
            "",
            " 1",
            "1 ",
            "+1",
            "-1",
            "01",
            "1.0",
            "1e3",
            "2k",
            "500m",
            "1Ki",
            "\u0663",
            "\u00b2",
            "\uff11",
            "1\u0663",
        ]
    ),
    st.text(alphabet="0123456789+-. eEkmMGi\u0663", max_size=8),
)


@settings(max_examples=300, deadline=None)
@given(counts)
def test_a_count_is_what_the_quantity_grammar_says(value: object) -> None:
    assert outcome(parse_count, value) == outcome(count_by_the_general_parser, value)


@pytest.mark.parametrize(("value", "count"), [("2", 2), (3, 3), ("007", 7), ("1e1", 10)])
def test_plain_counts_are_read(value: object, count: int) -> None:
    assert parse_count(value) == count


@pytest.mark.parametrize("value", ["\u00b2", "9" * 65, True, -1, "1.5"])
def test_what_is_not_a_count_is_refused(value: object) -> None:
    with pytest.raises(QuantityError):
        parse_count(value)


def test_memory_sizes_are_exact_and_round_up() -> None:
    assert parse_quantity("0.5Gi") == Fraction(2**29)
    assert parse_bytes("1500m") == 2
    assert format_bytes(parse_bytes("12Gi")) == "12Gi"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("80Gi", 80 * 2**30), ("132", 132), (7, 7), ("500m", Fraction(1, 2)), ("1e3", 1000)],
)
def test_exact_values_are_ints_when_whole_and_fractions_otherwise(
    text: str | int, expected: int | Fraction
) -> None:
    value = exact_value(text)
    assert value == expected
    assert isinstance(value, int) == (Fraction(expected).denominator == 1)


@pytest.mark.parametrize(
    "number", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"]
)
def test_json_numbers_that_are_not_finite_are_quantity_errors(number: float) -> None:
    """JSON NaN, Infinity and 1e400 decode to these floats; they are bad input, not a crash."""
    for parse in (parse_count, parse_bytes, parse_quantity):
        with pytest.raises(QuantityError, match="not a quantity"):
            parse(number)
