"""`convert` edits a file as a careful engineer would: the diff a reviewer reads holds only the
lines that asked for GPUs (removed, or a flow line rewritten) and the lines added for the claim,
its annotation and the templates. Indentation of lists, quoting, flow style, booleans as
written, comments and their places, line endings, a byte-order mark and trailing whitespace are
kept byte for byte. Checked on every manifest the convert tests use, and one property at a time.
"""

from __future__ import annotations

import ast
import difflib
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_slicer.cli.main import main
from gpu_slicer.kube import documents

HERE = Path(__file__).parent
DATA = HERE / "data"

GPU_LINE = re.compile(r"nvidia\.com/(?:gpu|mig-)")
"""A line that asks for a GPU (a legacy extended resource)."""
EMPTIED_KEY = re.compile(r"^\s*(?:- )?(?:resources|limits|requests):\s*(?:#.*)?$")
"""A key left with nothing under it once its GPU lines are gone."""
CLAIM_LINE = re.compile(
    r"^\s*(?:- )?(?:claims:|name: gpu-slicer|request: [\w.-]+|resourceClaims:"
    r"|resourceClaimTemplateName: gpu-slicer-|metadata:|annotations:|gpu-slicer\.io/converted: )"
)
"""A line the conversion adds: the claim, its template's name, the converted annotation."""
CONVERT_TESTS = [
    "test_convert.py",
    "test_convert_dir.py",
    "test_convert_inputs.py",
    "test_convert_workloads.py",
    "test_gitops.py",
    "test_gitops_tools.py",
]


def _module_manifests() -> dict[str, str]:
    """The manifests the convert tests define at module level (constants holding objects)."""
    found = {}
    for name in CONVERT_TESTS:
        tree = ast.parse((HERE / name).read_text())
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
                and "apiVersion:" in node.value.value
            ):
                found[f"{name}:{node.targets[0].id}"] = node.value.value
    return found


def _corpus() -> dict[str, str]:
    files = sorted(DATA.glob("*.yaml")) + sorted((DATA / "fidelity").glob("*.yaml"))
    corpus = {str(p.relative_to(HERE)): p.read_text() for p in files}
    corpus.update(_module_manifests())
    return {name: text for name, text in corpus.items() if _readable(text)}


def _readable(text: str) -> bool:
    """Whether ``text`` is YAML convert edits (a Helm template or a format string is not)."""
    try:
        return bool(documents.parse_all(text)) and "{{" not in text
    except documents.DocumentError:
        return False


CORPUS = _corpus()


def _rewrites(removed: str, added: str) -> bool:
    """Whether ``added`` is ``removed`` with only the converted annotation inserted in it (a
    flow mapping that gained the key)."""
    prefix = len(removed)
    for i, (a, b) in enumerate(zip(removed, added, strict=False)):
        if a != b:
            prefix = i
            break
    suffix = 0
    while (
        suffix < len(removed) - prefix
        and suffix < len(added) - prefix
        and removed[-1 - suffix] == added[-1 - suffix]
    ):
        suffix += 1
    inserted = added[prefix : len(added) - suffix]
    return prefix + suffix == len(removed) and "gpu-slicer.io/converted" in inserted


TEMPLATES = re.compile(
    r"^---\r?\napiVersion: resource\.k8s\.io/v1\r?\nkind: ResourceClaimTemplate\r?$", re.M
)


def diff_problems(source: str, output: str) -> list[str]:
    """Every line of the diff from ``source`` to ``output`` that conversion had no reason to
    write: an empty list when the diff is what it must be."""
    problems = []
    eol = "\r\n" if source.split("\n", 1)[0].endswith("\r") else "\n"
    appended = TEMPLATES.search(output)
    if appended is not None:  # the templates, documents of their own after the file's
        templates = output[appended.start() :]
        output = output[: appended.start()]
        if any(d.get("kind") != "ResourceClaimTemplate" for d in yaml.safe_load_all(templates)):
            problems.append("something other than templates appended")
        if eol == "\r\n" and templates.count("\n") != templates.count("\r\n"):
            problems.append("templates appended with another line ending")
    before = source.splitlines(keepends=True)
    after = output.splitlines(keepends=True)
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        removed, added = before[i1:i2], after[j1:j2]
        for line in removed:
            text = line.rstrip("\r\n")
            if not (
                GPU_LINE.search(text)
                or EMPTIED_KEY.match(text)
                or any(_rewrites(text, a.rstrip("\r\n")) for a in added)
            ):
                problems.append(f"removed a line that asks for no GPU: {line!r}")
        for line in added:
            text = line.rstrip("\r\n")
            if line.endswith("\n") and not line.endswith(eol):
                problems.append(f"added a line with another line ending: {line!r}")
            if not (
                CLAIM_LINE.match(text)
                or (GPU_LINE.search("".join(removed)) and "gpu-slicer" in text)
                or any(_rewrites(r.rstrip("\r\n"), text) for r in removed)
            ):
                problems.append(f"added a line that is no claim: {line!r}")
    return problems


def _convert(path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[str, str]:
    code = main(["convert", str(path), *args])
    captured = capsys.readouterr()
    assert code in (0, 1), captured.err
    return captured.out, captured.err


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_every_test_manifest_converts_with_a_minimal_diff(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = CORPUS[name]
    path = tmp_path / "manifest.yaml"
    path.write_text(source)
    out, err = _convert(path, capsys)
    assert "rewritten whole" not in err
    assert diff_problems(source, out) == []
    # and the text holds exactly what the conversion made
    as_json, _ = _convert(path, capsys, "-o", "json")
    assert documents.parse_all(out) == json.loads(as_json)["items"]


def test_the_corpus_asks_for_gpus_in_every_layout_it_claims_to() -> None:
    """The check above would pass on files that convert nothing: the corpus must convert."""
    converted = [n for n, text in CORPUS.items() if GPU_LINE.search(text)]
    assert len(converted) >= 10
    layouts = "".join(CORPUS.values())
    for shape in (
        r"(?m)^( *)containers:\n\1- ",  # lists flush with their key
        r"(?m)^( *)containers:\n\1  - ",  # and indented under it
        r"\{limits: \{nvidia\.com",  # a GPU request in a flow mapping
        r"annotations: \{",
        r": False\n",
        r"(?m)^ *# .*\n *nvidia\.com/",  # a comment right above a GPU line
        r"(?m)^# .*\n(?:---\n|\Z)",  # a comment at the end of a document
    ):
        assert re.search(shape, layouts), shape


def test_the_diff_check_names_unrelated_changes() -> None:
    source = "a:\n  - x\n  flag: False\n  nvidia.com/gpu: 1\n"
    assert diff_problems(source, "a:\n  - x\n  flag: False\n  claims: []\n") == []
    assert diff_problems(source, "a:\n- x\n  flag: False\n") != []
    assert diff_problems(source, "a:\n  - x\n  flag: false\n") != []
    assert diff_problems(source.replace("\n", "\r\n"), "a:\r\n  - x\r\n  flag: False\r\n") == []
    assert diff_problems(source.replace("\n", "\r\n"), "a:\r\n  - x\r\n  flag: False\n  b: 1\n")


# --- one property at a time --------------------------------------------------------------------

POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: infer
  namespace: ml
spec:
  containers:
  - name: main
    image: registry.example/infer:1
    resources:
      limits:
        cpu: "1"
        nvidia.com/gpu: 1
"""


def _converted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str | bytes, name: str = "p.yaml"
) -> tuple[bytes, str]:
    """The file converted by ``--out-dir`` (bytes as written), and stderr."""
    tree = tmp_path / "tree"
    tree.mkdir()
    data = source.encode() if isinstance(source, str) else source
    (tree / name).write_bytes(data)
    assert main(["convert", str(tree), "--out-dir", str(tmp_path / "out")]) == 0
    return (tmp_path / "out" / name).read_bytes(), capsys.readouterr().err


def _objects(data: bytes) -> list[Any]:
    return documents.parse_all(data.decode("utf-8"))


def test_a_crlf_file_stays_crlf_throughout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = POD.replace("\n", "\r\n").encode()
    out, _ = _converted(tmp_path, capsys, source)
    assert out.count(b"\n") == out.count(b"\r\n") > POD.count("\n")
    assert diff_problems(source.decode(), out.decode()) == []
    pod = _objects(out)[0]
    assert pod["spec"]["resourceClaims"][0]["name"] == "gpu-slicer"


def test_a_crlf_file_given_alone_stays_crlf(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "pod.yaml"
    path.write_bytes(POD.replace("\n", "\r\n").encode())
    out, _ = _convert(path, capsys)
    assert out.count("\n") == out.count("\r\n") > POD.count("\n")


def test_a_byte_order_mark_is_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = _converted(tmp_path, capsys, "\ufeff" + POD)
    assert out.startswith(b"\xef\xbb\xbfapiVersion: v1\n")
    assert out.count(b"\xef\xbb\xbf") == 1
    assert diff_problems("\ufeff" + POD, out.decode()) == []


def test_a_byte_order_mark_stays_at_the_start_of_a_printed_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n")
    (tree / "b.yaml").write_text("\ufeff" + POD)
    assert main(["convert", str(tree)]) == 0
    out = capsys.readouterr().out
    assert "\ufeff" not in out
    assert [d["kind"] for d in yaml.safe_load_all(out)][:2] == ["ConfigMap", "Pod"]


def test_flow_mappings_stay_flow_and_only_gain_the_annotation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = POD.replace(
        "  name: infer\n", "  name: infer\n  annotations: {team: ml, 'note': \"x\"}\n"
    ).replace("spec:\n  containers:", "spec:\n  nodeSelector: {pool: gpu}\n  containers:")
    source = source.replace("kind: Pod\n", "kind: Pod\n", 1)
    out, _ = _converted(tmp_path, capsys, source)
    text = out.decode()
    assert "  nodeSelector: {pool: gpu}\n" in text
    assert "  annotations: {team: ml, 'note': \"x\", gpu-slicer.io/converted: '{" in text
    assert diff_problems(source, text) == []


def test_a_gpu_request_in_a_flow_line_is_rewritten_on_that_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = POD.replace(
        '    resources:\n      limits:\n        cpu: "1"\n        nvidia.com/gpu: 1\n',
        '    resources: {limits: {cpu: "1", nvidia.com/gpu: 1}}\n',
    )
    out, _ = _converted(tmp_path, capsys, source)
    text = out.decode()
    assert (
        '    resources: {limits: {cpu: "1"}, claims: [{name: gpu-slicer, request: main}]}\n' in text
    )
    assert diff_problems(source, text) == []


def test_booleans_keep_their_spelling(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = POD.replace("spec:\n", "spec:\n  enableServiceLinks: False\n  hostIPC: FALSE\n", 1)
    out, _ = _converted(tmp_path, capsys, source)
    assert b"  enableServiceLinks: False\n  hostIPC: FALSE\n" in out


def test_a_comment_above_a_removed_gpu_line_is_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = POD.replace(
        "        nvidia.com/gpu: 1\n", "        # one GPU\n        nvidia.com/gpu: 1\n"
    )
    out, _ = _converted(tmp_path, capsys, source)
    assert b'        cpu: "1"\n        # one GPU\n' in out
    assert b"nvidia.com/gpu: 1" not in out


def test_comments_in_a_removed_block_are_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = POD.replace('        cpu: "1"\n', "        # the accelerator\n")
    out, _ = _converted(tmp_path, capsys, source)
    text = out.decode()
    assert "      limits:" not in text
    assert "        # the accelerator\n" in text
    assert diff_problems(source, text) == []


def test_claims_go_before_a_trailing_comment_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tail = "# Owned by team ml.\n# Reviewed quarterly.\n"
    source = POD + tail + "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"
    out, _ = _converted(tmp_path, capsys, source)
    text = out.decode()
    first = text[: text.index("---\n")]
    assert first.endswith("resourceClaimTemplateName: " + _template_name(text) + "\n" + tail)
    assert diff_problems(source, text) == []


def _template_name(text: str) -> str:
    (template,) = [d for d in yaml.safe_load_all(text) if d["kind"] == "ResourceClaimTemplate"]
    return str(template["metadata"]["name"])


@pytest.mark.parametrize("dash", ["", "  "], ids=["flush", "indented"])
def test_lists_added_are_indented_as_their_siblings_and_others_are_untouched(
    dash: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = (
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: infer\nspec:\n"
        f"  containers:\n  {dash}- name: main\n  {dash}  image: img\n"
        f"  {dash}  args:\n  {dash}  - --a\n  {dash}  - --b\n"
        f"  {dash}  resources:\n  {dash}    limits:\n  {dash}      nvidia.com/gpu: 1\n"
        f"  tolerations:\n  {dash}- key: gpu\n  {dash}  operator: Exists\n"
    )
    out, _ = _converted(tmp_path, capsys, source)
    text = out.decode()
    assert f"\n  resourceClaims:\n  {dash}- name: gpu-slicer\n" in text
    assert f"\n  {dash}    claims:\n  {dash}    {dash}- name: gpu-slicer\n" in text
    assert f"  {dash}  args:\n  {dash}  - --a\n  {dash}  - --b\n" in text
    assert diff_problems(source, text) == []


def test_trailing_whitespace_and_double_spaces_are_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = POD.replace("  name: infer\n", "  name:  infer   \n").replace(
        "    image: registry.example/infer:1\n", "    image: registry.example/infer:1  \n"
    )
    out, _ = _converted(tmp_path, capsys, source)
    assert b"  name:  infer   \n" in out
    assert b"    image: registry.example/infer:1  \n" in out


def test_a_document_with_aliases_is_rewritten_whole_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = POD.replace("  namespace: ml\n", "  namespace: ml\n  labels: &l {app: infer}\n")
    source += "  nodeSelector: *l\n"
    out, err = _converted(tmp_path, capsys, source)
    assert "p.yaml: document 1 (Pod infer) rewritten whole" in err
    assert "YAML anchors and aliases" in err
    pod = _objects(out)[0]
    assert pod["spec"]["nodeSelector"] == {"app": "infer"}
    assert pod["spec"]["resourceClaims"][0]["name"] == "gpu-slicer"


def test_a_kustomization_gains_its_templates_file_in_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kustomization = (
        "# prod overlay\napiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\nresources:\n  - ../../base   # shared\n"
        "patches:\n  - path: gpu.yaml\n# end\n"
    )
    patch = (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: infer}\nspec:\n  containers:\n"
        "  - name: main\n    resources: {limits: {nvidia.com/gpu: 1}}\n"
    )
    tree = tmp_path / "tree"
    (tree / "overlays/prod").mkdir(parents=True)
    (tree / "overlays/prod/kustomization.yaml").write_text(kustomization)
    (tree / "overlays/prod/gpu.yaml").write_text(patch)
    assert main(["convert", str(tree), "--out-dir", str(tmp_path / "out")]) == 0
    written = (tmp_path / "out/overlays/prod/kustomization.yaml").read_text()
    assert written == kustomization.replace(
        "  - ../../base   # shared\n", "  - ../../base   # shared\n  - gpu-slicer-templates.yaml\n"
    )


def test_a_part_that_cannot_be_edited_in_place_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = POD.replace(
        '        cpu: "1"\n', '        cpu: "1"\n      # twice\n      limits:\n        cpu: "1"\n'
    )
    out, err = _converted(tmp_path, capsys, source)
    assert "p.yaml: document 1 (Pod infer): spec.containers[0].resources rewritten" in err
    assert "appears twice" in err
    pod = _objects(out)[0]
    assert pod["spec"]["containers"][0]["resources"]["claims"][0]["name"] == "gpu-slicer"
    assert POD[POD.index("  containers:") : POD.index("      limits:")] in out.decode()
