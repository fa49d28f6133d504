"""JSON Patch building: pointer escaping and adds that create missing parents."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_slicer.webhook import patch


def applied(doc: dict[str, Any], ops: list[dict[str, Any]]) -> Any:
    return jsonpatch.apply_patch(copy.deepcopy(doc), ops)


def set_entry(doc: Any, parent: list[patch.Token], key: str, value: Any) -> patch.Op:
    """Both steps, as translation takes them: where the document stands, then the operation."""
    return patch.map_entry_op(patch.map_state(doc, parent), parent, key, value)


def append(doc: Any, parent: list[patch.Token], value: Any) -> patch.Op:
    (op,) = patch.list_ops(patch.list_state(doc, parent), parent, [value])
    return op


@pytest.mark.parametrize(
    ("token", "escaped"),
    [
        ("nvidia.com/gpu", "nvidia.com~1gpu"),
        ("a~b", "a~0b"),
        ("~/", "~0~1"),
        ("~1", "~01"),
        (3, "3"),
    ],
)
def test_tokens_are_escaped_tilde_first(token: str | int, escaped: str) -> None:
    assert patch.escape(token) == escaped


def test_a_key_with_a_slash_is_removed_from_the_right_map() -> None:
    doc = {"limits": {"nvidia.com/gpu": "1", "nvidia.com": "x", "cpu": "1"}}
    assert applied(doc, [patch.remove(["limits", "nvidia.com/gpu"])]) == {
        "limits": {"nvidia.com": "x", "cpu": "1"}
    }


def test_a_key_with_a_tilde_round_trips_through_jsonpatch() -> None:
    doc: dict[str, Any] = {"m": {}}
    assert applied(doc, [set_entry(doc, ["m"], "a~1/b", 1)]) == {"m": {"a~1/b": 1}}


def test_setting_an_entry_creates_every_missing_map() -> None:
    doc: dict[str, Any] = {"metadata": {"name": "x"}}
    op = set_entry(doc, ["metadata", "annotations"], "gpu-slicer.io/converted", "{}")
    assert op == {
        "op": "add",
        "path": "/metadata/annotations",
        "value": {"gpu-slicer.io/converted": "{}"},
    }
    assert applied(doc, [op])["metadata"] == {
        "name": "x",
        "annotations": {"gpu-slicer.io/converted": "{}"},
    }


def test_setting_an_entry_under_a_missing_grandparent_nests_the_maps() -> None:
    doc: dict[str, Any] = {}
    op = set_entry(doc, ["metadata", "annotations"], "k", "v")
    assert applied(doc, [op]) == {"metadata": {"annotations": {"k": "v"}}}


def test_setting_an_entry_keeps_the_other_entries() -> None:
    doc = {"metadata": {"annotations": {"other": "1"}}}
    op = set_entry(doc, ["metadata", "annotations"], "k", "v")
    assert op["path"] == "/metadata/annotations/k"
    assert applied(doc, [op])["metadata"]["annotations"] == {"other": "1", "k": "v"}


def test_a_null_parent_is_treated_as_missing() -> None:
    doc: dict[str, Any] = {"metadata": {"annotations": None}}
    op = set_entry(doc, ["metadata", "annotations"], "k", "v")
    assert applied(doc, [op])["metadata"]["annotations"] == {"k": "v"}


def test_appending_to_a_missing_list_creates_it() -> None:
    doc: dict[str, Any] = {"spec": {"containers": [{"name": "a"}]}}
    op = append(doc, ["spec", "containers", 0, "resources", "claims"], {"name": "c"})
    assert op == {
        "op": "add",
        "path": "/spec/containers/0/resources",
        "value": {"claims": [{"name": "c"}]},
    }
    assert applied(doc, [op])["spec"]["containers"][0] == {
        "name": "a",
        "resources": {"claims": [{"name": "c"}]},
    }


def test_appending_to_an_existing_list_keeps_its_entries() -> None:
    doc = {"spec": {"resourceClaims": [{"name": "mine"}]}}
    op = append(doc, ["spec", "resourceClaims"], {"name": "gpu-slicer"})
    assert op["path"] == "/spec/resourceClaims/-"
    assert applied(doc, [op])["spec"]["resourceClaims"] == [
        {"name": "mine"},
        {"name": "gpu-slicer"},
    ]


def test_lookup_never_raises_on_wrong_shapes() -> None:
    doc = {"a": [1, {"b": 2}], "s": "text"}
    assert patch.lookup(doc, ["a", 1, "b"]) == 2
    assert patch.lookup(doc, ["a", 5]) is None
    assert patch.lookup(doc, ["s", "x"]) is None
    assert patch.lookup(doc, ["a", "b"]) is None


def test_the_pointer_of_the_root_is_empty() -> None:
    assert patch.pointer([]) == ""
    assert patch.pointer(["spec", "containers", 0]) == "/spec/containers/0"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(alphabet="ab/~01", max_size=4), st.integers(0, 12)), max_size=6))
def test_a_pointer_escapes_every_token(tokens: list[str | int]) -> None:
    assert patch.pointer(tokens) == "".join("/" + patch.escape(t) for t in tokens)


def test_a_list_where_something_else_stands_is_replaced_and_paths_start_at_the_node() -> None:
    container = {"name": "main", "resources": {"claims": "not-a-list"}}
    doc = {"spec": {"containers": [container]}}
    state = patch.list_state(container, ["resources", "claims"])
    assert state == patch.NOT_LIST
    ops = patch.list_ops(
        state, ["resources", "claims"], [{"name": "a"}, {"name": "b"}], at=["spec", "containers", 0]
    )
    assert applied(doc, ops)["spec"]["containers"][0]["resources"]["claims"] == [
        {"name": "a"},
        {"name": "b"},
    ]
