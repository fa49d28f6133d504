"""New values (templates, claim entries) are written once per shape and filled in after
(webhook.yaml_text.written): the text must be exactly what ruamel.yaml writes for each value,
whatever its strings say. These tests compare texts; none measures time."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from gpu_slicer.webhook import yaml_text

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


def test_scalars_are_written_in_flow_as_pyyaml_writes_them() -> None:
    """The single quotes written without PyYAML's emitter (a record's JSON) are PyYAML's."""
    import json
    import random

    chooser = random.Random(7)
    alphabet = [*"ab :,[]{}'\"#&*!|>%@`?-=\\/", " ", "\t", "\n", "é"]
    texts = [json.dumps({"a": [1, "b c"], "d": "it's"}), "{", "[a]", " {a}", "{a} ", "a,b"]
    texts += ["".join(chooser.choices(alphabet, k=chooser.randint(1, 12))) for _ in range(3000)]
    for text in texts:
        assert yaml_text._flow_scalar(text) == yaml_text._flow_scalar_written(text), text


def test_values_are_the_same_only_with_the_same_types_all_the_way_down() -> None:
    nan = float("nan")
    values: list[Any] = [
        1,
        True,
        1.0,
        -0.0,
        0.0,
        "1",
        None,
        nan,
        float("inf"),
        [1],
        [True],
        [1.0],
        [nan],
        [-0.0],
        [0.0],
        {"a": 1},
        {"a": True},
        {1: "a"},
        {True: "a"},
        {1.0: "a"},
        {"1": "a"},
        {"a": 1, "b": [2]},
        {"b": [2], "a": 1},
        {"a": {"b": [1, {"c": -0.0}]}},
        {"a": {"b": [1, {"c": 0.0}]}},
        {1: "a", "b": 2},
        (1,),
        __import__("datetime").date(2024, 1, 1),
    ]
    for a in values:
        for b in values:
            assert yaml_text.same(a, b) == yaml_text._same_walk(a, b), (a, b)


def test_a_stream_is_cut_at_the_same_lines_with_one_search_as_line_by_line() -> None:
    import random

    chooser = random.Random(11)
    lines = ["---", "--- # c", "---  ", "---\t", "--- x", " ---", "----", "---#", "a: 1", "", "#"]
    lines += ["...", "\ufeff---", "- b", "--- |", "x: '---'"]
    for _ in range(3000):
        eol = chooser.choice(["\n", "\r\n"])
        picked = chooser.choices(lines, k=chooser.randint(0, 8))
        text = eol.join(picked) + chooser.choice(["", eol])
        assert yaml_text._OTHER_BREAKS.search(text) is None
        assert yaml_text._documents_as_written(text) == yaml_text._documents_line_by_line(text)
    assert yaml_text._documents_as_written("a\r---\nb") == ["a\r", "---\nb"]  # line by line
