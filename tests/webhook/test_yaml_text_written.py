"""New values (templates, claim entries) are written once per shape and filled in after
(webhook.yaml_text.written): the text must be exactly what ruamel.yaml writes for each value,
whatever its strings say. These tests compare texts; none measures time."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from webhook import yaml_text

STRINGS = [
    "gpu-slicer-6370bc703a",
    "team-0",
    "app-0-c0",
    "a",
    "A",
    "x" * 252,
    "x" * 253,  # too long to be put in a slot
    "gpu.gpu-slicer.io",
    "apps/v1",
    "v1.2.3",
    "1.2.3",
    "yes",
    "no",
    "on",
    "y",
    "true",
    "False",
    "null",
    "Null",
    "~",
    "1e3",
    "0x1f",
    "0o17",
    "0b11",
    "1_000",
    "1:20",
    "12",
    "-1",
    ".5",
    ".inf",
    ".nan",
    "2024-01-01",
    "2024-01-01T00:00:00Z",
    "",
    " ",
    "a b",
    "a: b",
    "a #b",
    "#a",
    "-a",
    "a-",
    "_a",
    "a_",
    "'a'",
    '"a"',
    "a\nb",
    "*a",
    "&a",
    "!a",
    "%a",
    "@a",
    "`a`",
    "a,b",
    "[a]",
    "{a}",
    "?a",
    ":a",
    "a:",
    "é",
    "gpuslicerslot0x",
    "gpuslicerslot1x",
]


def _template(name: str, namespace: str, request: str, count: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "gpu-slicer"},
            "namespace": namespace,
        },
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": request,
                            "firstAvailable": [
                                {"name": "gpu", "count": count, "selectors": []},
                                {"name": "mig", "count": count, "selectors": [{"cel": {}}]},
                            ],
                        }
                    ]
                }
            }
        },
    }


@pytest.mark.parametrize(("mapping", "offset"), [(2, 0), (2, 2), (4, 2), (3, 1)])
def test_each_value_is_written_as_ruamel_yaml_writes_it(mapping: int, offset: int) -> None:
    values: list[Any] = []
    for a, b in itertools.product(STRINGS, ["team-0", "yes", "1e3", "a b"]):
        values.append(_template(a, b, a, 1))
        values.append({"claims": [{"name": "gpu-slicer", "request": a}], "x": {a: b}})
    values += [
        _template("n", "ns", "r", True),
        _template("n", "ns", "r", None),
        _template("n", "ns", "r", 2),
        {"a": [[], {}, [1, [2, {"b": None}]], {"c": False}]},
        {"a": 1.5},  # a float: not remembered
        {1: "a"},  # a key that is not text: not remembered
        {"a": ("b", "c")},  # a tuple: not remembered
    ]
    for value in values:
        expected = yaml_text._ruamel_written(value, mapping, offset)
        assert yaml_text.written(value, mapping, offset) == expected, value
        assert yaml_text.written(value, mapping, offset) == expected, value  # remembered


def test_a_string_that_would_not_be_written_plain_is_part_of_the_shape() -> None:
    for text in ("true", "1e3", "2024-01-01", "0x1f", "a b", "a: b", "yes", "-a", "x" * 253):
        assert not yaml_text._slotted(text), text
    assert yaml_text._slotted("gpu-slicer-6370bc703a")
    assert yaml_text._slotted("team-0")
