"""A JSON manifest is edited where the conversion changed it and kept byte for byte elsewhere,
whatever its writer's layout: indentation step (spaces, tabs, none), separators, CRLF, a
byte-order mark, no last line break, a single object or a ``v1`` List."""

from __future__ import annotations

import copy
import difflib
import json
from pathlib import Path
from typing import Any

import pytest

from gpu_slicer.cli.main import main
from gpu_slicer.webhook import json_text
from gpu_slicer.webhook.yaml_text import BOM

DEPLOYMENT: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "infer", "labels": {"app": "infer"}},
    "spec": {
        "replicas": 1,
        "template": {
            "metadata": {"labels": {"app": "infer"}},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "nvcr.io/nim/llama:1.0",
                        "resources": {"limits": {"cpu": "2", "nvidia.com/mig-1g.10gb": 1}},
                    },
                    {"name": "sidecar", "image": "busybox:1.36"},
                ]
            },
        },
    },
}
TEMPLATE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "gpu-slicer-1"},
}


def _converted(value: dict[str, Any]) -> dict[str, Any]:
    """What conversion does to the Deployment: a key removed, keys added, a list grown."""
    new = copy.deepcopy(value)
    pod = new["spec"]["template"]["spec"]
    main_container = pod["containers"][0]
    del main_container["resources"]["limits"]["nvidia.com/mig-1g.10gb"]
    main_container["resources"]["claims"] = [{"name": "gpu-slicer", "request": "main"}]
    pod["resourceClaims"] = [{"name": "gpu-slicer", "resourceClaimTemplateName": "gpu-slicer-1"}]
    new["spec"]["template"]["metadata"]["annotations"] = {"gpu-slicer.io/converted": "{}"}
    return new


LAYOUTS = {
    "indent 2": lambda v: json.dumps(v, indent=2) + "\n",
    "indent 4": lambda v: json.dumps(v, indent=4) + "\n",
    "tabs, CRLF, byte-order mark": lambda v: (
        BOM + json.dumps(v, indent="\t").replace("\n", "\r\n") + "\r\n"
    ),
    "no last line break": lambda v: json.dumps(v, indent=2),
    "space before colons": lambda v: json.dumps(v, indent=2, separators=(",", " : ")) + "\n",
}


def _unchanged_lines_kept(source: str, out: str) -> None:
    """Every source line survives in order but the GPU request's, up to a comma at its end
    (JSON wants one between members and none after the last, so a line before a member added
    or removed gains or loses it)."""
    old, new = _comma_free(source), _comma_free(out)
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    lost = [
        old[i]
        for tag, i1, i2, _, _ in matcher.get_opcodes()
        if tag != "equal"
        for i in range(i1, i2)
    ]
    assert len(lost) == 1 and "nvidia.com/" in lost[0], lost


def _comma_free(text: str) -> list[str]:
    lines = text.removeprefix(BOM).splitlines()
    return [line.removesuffix(",") for line in lines]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_single_object_keeps_every_line_the_conversion_did_not_touch(layout: str) -> None:
    source = LAYOUTS[layout](DEPLOYMENT)
    edited = json_text.edit(source, DEPLOYMENT, _converted(DEPLOYMENT), [TEMPLATE])
    assert edited.whole is None
    body = edited.text.removeprefix(BOM)
    assert json.loads(body) == {
        "apiVersion": "v1",
        "kind": "List",
        "items": [_converted(DEPLOYMENT), TEMPLATE],
    }
    assert edited.text.startswith(BOM) == source.startswith(BOM)
    eol = "\r\n" if "\r\n" in source else "\n"
    assert edited.text.count("\n") == edited.text.count(eol)
    assert edited.text.endswith("\n") == source.endswith("\n")
    _unchanged_lines_kept(source, edited.text)


def test_new_values_take_the_files_indentation_step() -> None:
    source = json.dumps(DEPLOYMENT, indent="\t") + "\n"
    out = json_text.edit(source, DEPLOYMENT, _converted(DEPLOYMENT), [TEMPLATE]).text
    assert '\n\t\t\t\t"resourceClaims": [\n\t\t\t\t\t{\n\t\t\t\t\t\t"name": "gpu-slicer",' in out
    assert '\n{\n\t"apiVersion": "resource.k8s.io/v1",' in out  # the template too


def test_a_list_gains_the_templates_among_its_items() -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": [DEPLOYMENT]}
    source = json.dumps(listed, indent=2) + "\n"
    converted = {**listed, "items": [_converted(DEPLOYMENT)]}
    edited = json_text.edit(source, listed, converted, [TEMPLATE])
    assert edited.whole is None
    assert json.loads(edited.text) == {**listed, "items": [_converted(DEPLOYMENT), TEMPLATE]}
    _unchanged_lines_kept(source, edited.text)
    assert edited.text.endswith("    }\n  ]\n}\n")  # no wrapper: the List's own closing lines


@pytest.mark.parametrize("separators", [(", ", ": "), (",", ":")])
def test_a_file_on_one_line_stays_on_its_separators(separators: tuple[str, str]) -> None:
    source = json.dumps(DEPLOYMENT, separators=separators)
    edited = json_text.edit(source, DEPLOYMENT, _converted(DEPLOYMENT), [])
    assert edited.whole is None
    assert "\n" not in edited.text
    assert json.loads(edited.text) == _converted(DEPLOYMENT)
    item, key = separators
    assert f'"resourceClaims"{key}[{{"name"{key}"gpu-slicer"{item}' in edited.text
    assert f'"image"{key}"busybox:1.36"' in edited.text


def test_escapes_and_key_order_the_writer_chose_are_kept() -> None:
    source = json.dumps(DEPLOYMENT, indent=2).replace('"busybox:1.36"', '"busybox\\u003a1.36"')
    source = source.replace(
        '"image": "nvcr.io/nim/llama:1.0"', '"image": "nvcr.io\\/nim/llama:1.0"'
    )
    edited = json_text.edit(source, DEPLOYMENT, _converted(DEPLOYMENT), [])
    assert '"busybox\\u003a1.36"' in edited.text
    assert '"nvcr.io\\/nim/llama:1.0"' in edited.text
    _unchanged_lines_kept(source, edited.text)


def test_a_file_json_reads_differently_is_written_whole_and_says_why() -> None:
    source = '{"kind": "Pod", "kind": "Pod", "metadata": {}}'
    edited = json_text.edit(source, {"kind": "Pod", "metadata": {}}, {"kind": "Pod"}, [])
    assert edited.whole == "an object whose keys appear twice"
    assert json.loads(edited.text) == {"kind": "Pod"}


def test_convert_out_dir_edits_a_json_manifest_in_place(tmp_path: Path) -> None:
    tree, out = tmp_path / "tree", tmp_path / "out"
    tree.mkdir()
    source = json.dumps(DEPLOYMENT, indent=4).replace("\n", "\r\n") + "\r\n"
    (tree / "deployment.json").write_bytes(source.encode())
    assert main(["convert", str(tree), "--out-dir", str(out)]) == 0
    written = (out / "deployment.json").read_bytes().decode()
    listed = json.loads(written)
    assert [item["kind"] for item in listed["items"]] == ["Deployment", "ResourceClaimTemplate"]
    container = listed["items"][0]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"cpu": "2"}
    assert written.count("\n") == written.count("\r\n")
    _unchanged_lines_kept(source, written)
