"""Label and field selector parsing and matching, as the in-memory apiserver applies them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_slicer.kube.selectors import (
    Selector,
    SelectorError,
    field_value,
    parse_field_selector,
    parse_label_selector,
)

KEYS = st.sampled_from(["app", "gpu-slicer.io/migration", "tier"])
VALUES = st.sampled_from(["enabled", "audit", "a", "b-1"])
LABELS = st.dictionaries(KEYS, VALUES, max_size=3)


def matches(selector: str, labels: dict[str, str]) -> bool:
    return Selector.parse(selector, None).matches({"metadata": {"labels": labels}})


@pytest.mark.parametrize(
    "selector",
    ["a=(", "a in ()", "=v", "a in (b", "a,,b", "a=b c", "a notin b"],
)
def test_malformed_label_selectors_are_a_bad_request(selector: str) -> None:
    with pytest.raises(SelectorError) as caught:
        parse_label_selector(selector)
    assert caught.value.status == 400


def test_a_prefixed_key_and_set_operators_parse() -> None:
    (first, second) = parse_label_selector("gpu-slicer.io/migration in (enabled, audit),!skip")
    assert (first.key, first.op, first.values) == (
        "gpu-slicer.io/migration",
        "in",
        frozenset({"enabled", "audit"}),
    )
    assert (second.key, second.op) == ("skip", "!exists")


def test_an_empty_selector_matches_everything() -> None:
    assert Selector.parse("", None).matches({"metadata": {}})
    assert Selector.parse(None, " ").matches({})


def test_not_equal_matches_objects_without_the_label() -> None:
    assert matches("tier!=gold", {})
    assert matches("tier notin (gold)", {})
    assert not matches("tier in (gold)", {})


@settings(max_examples=60)
@given(labels=LABELS, key=KEYS, values=st.sets(VALUES, min_size=1, max_size=3))
def test_in_and_notin_are_complements(labels: dict[str, str], key: str, values: set[str]) -> None:
    joined = ",".join(sorted(values))
    assert matches(f"{key} in ({joined})", labels) != matches(f"{key} notin ({joined})", labels)


@settings(max_examples=60)
@given(labels=LABELS, key=KEYS, value=VALUES)
def test_equality_operators_agree_with_the_labels(
    labels: dict[str, str], key: str, value: str
) -> None:
    assert matches(f"{key}={value}", labels) == (labels.get(key) == value)
    assert matches(f"{key}!={value}", labels) == (labels.get(key) != value)
    assert matches(key, labels) == (key in labels) != matches(f"!{key}", labels)


def test_field_selectors_compare_nested_fields_as_strings() -> None:
    obj = {"metadata": {"name": "s"}, "spec": {"nodeName": "n", "allNodes": True, "count": 2}}
    assert Selector.parse(None, "spec.nodeName=n,metadata.name==s").matches(obj)
    assert Selector.parse(None, "spec.allNodes=true,spec.count=2").matches(obj)
    assert not Selector.parse(None, "spec.nodeName!=n").matches(obj)


def test_a_missing_field_compares_as_empty() -> None:
    assert field_value({"spec": {}}, ("spec", "nodeName")) == ""
    assert Selector.parse(None, "spec.nodeName=").matches({"spec": {}})


def test_a_field_requirement_without_an_operator_is_a_bad_request() -> None:
    with pytest.raises(SelectorError, match="path=value"):
        parse_field_selector("spec.nodeName")
