"""`convert` reads in full only the documents that may ask for GPUs (issue 33, item 5).

A document without ``nvidia.com/``, ``gpu-slicer.io/`` or a kind that decides for others
(CustomResourceDefinition, ResourceQuota, DeviceClass), as written or once the escapes of its
double-quoted scalars are read, cannot ask for a GPU: it is checked with libyaml
(``kube.documents.parse_all_fast``) and printed byte for byte, never read by the Python reader,
composed or edited. These tests count what reads what; none measures time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_slicer.cli.main import main
from gpu_slicer.kube import documents
from gpu_slicer.webhook import gitops, yaml_text

PLAIN = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: scripts   # kept as written
data:
  run.sh: |
    echo "a\\nb" \\
      && echo done
  settings.json: '{"url": "http:\\/\\/example.com", "lt": "\\u003c"}'
"""

GPU = """\
apiVersion: v1
kind: Pod
metadata: {name: infer}
spec:
  containers:
    - name: main
      image: infer:1
      resources:
        limits:
          {key}: 1
"""


def _spy(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[str]:
    """The texts ``module.name`` is called with, from now on."""
    seen: list[str] = []
    real = getattr(module, name)

    def spy(text: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(text)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return seen


def test_a_document_without_gpu_text_is_printed_as_written_and_never_read_in_full(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "in.yaml"
    gpu = GPU.replace("{key}", "nvidia.com/gpu")
    source.write_text(PLAIN + "---\n" + gpu)
    read = _spy(monkeypatch, documents, "parse_all")
    composed = _spy(monkeypatch, documents, "compose_all")
    with_nodes = _spy(monkeypatch, documents, "read_with_nodes")
    checked = _spy(monkeypatch, documents, "parse_all_fast")

    assert main(["convert", str(source)]) == 0
    out = capsys.readouterr().out

    assert out.startswith(PLAIN + "---\n")
    assert "resourceClaimTemplateName" in out
    assert PLAIN in checked
    assert not any("kind: ConfigMap" in text for text in [*read, *composed, *with_nodes])
    assert any("kind: Pod" in text for text in with_nodes)


def test_with_json_output_every_document_is_read_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "in.yaml"
    source.write_text(PLAIN)
    checked = _spy(monkeypatch, documents, "parse_all_fast")

    assert main(["convert", "-o", "json", str(source)]) == 0

    assert '"name": "scripts"' in capsys.readouterr().out
    assert checked == []


@pytest.mark.parametrize(
    "key",
    [
        '"nvidia\\x2ecom/gpu"',
        '"nvidia.com\\/gpu"',
        '"\\u006evidia.com/gpu"',
        '"\\U0000006Evidia.com/gpu"',
    ],
)
def test_a_gpu_request_spelled_with_escapes_is_read_and_converted(
    key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.yaml"
    source.write_text(GPU.replace("{key}", key))
    assert yaml_text.may_ask_for_gpus(source.read_text())

    assert main(["convert", str(source)]) == 0

    out = capsys.readouterr().out
    assert "resourceClaimTemplateName" in out and key not in out


def test_a_gpu_annotation_broken_across_lines_by_an_escape_is_read() -> None:
    text = 'metadata:\n  annotations:\n    a: "gpu-sli\\\n      cer.io/gpu-memory"\n'
    assert documents.parse(text)["metadata"]["annotations"]["a"] == "gpu-slicer.io/gpu-memory"
    assert yaml_text.may_ask_for_gpus(text)


@pytest.mark.parametrize(
    "text",
    [
        PLAIN,
        'a: "\\\\x2e\\\\u002e"\n',  # escaped backslashes: no dot is made
        "kind: Service\nmetadata: {name: nvidia-com}\n",
        "# a comment about gpus\nkind: Secret\n",
    ],
)
def test_what_holds_no_gpu_text_is_not_read(text: str) -> None:
    assert not yaml_text.may_ask_for_gpus(text)


@pytest.mark.parametrize(
    "text",
    [
        "limits: {nvidia.com/gpu: 1}\n",
        "# nvidia.com/gpu: 1 (a comment counts)\n",
        "labels: {gpu-slicer.io/skip: 'true'}\n",
        "kind: ResourceQuota\n",
        'kind: "Custom\\x52esourceDefinition"\n',
        "kind: DeviceClass\n",
    ],
)
def test_what_may_ask_for_gpus_or_decide_for_others_is_read(text: str) -> None:
    assert yaml_text.may_ask_for_gpus(text)


def test_a_malformed_document_without_gpu_text_is_still_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.yaml"
    bad = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {replicas: 1}\n"
    source.write_text(PLAIN + "---\n" + bad)

    assert main(["convert", str(source)]) == 1

    out, err = capsys.readouterr()
    assert out == PLAIN + "---\n" + bad
    assert "document 2 (Deployment d): spec.template: no pod template" in err


def test_invalid_yaml_without_gpu_text_keeps_the_file_and_names_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.yaml"
    source.write_text(GPU.replace("{key}", "nvidia.com/gpu") + "---\na: [\n")

    assert main(["convert", str(source)]) == 1

    err = capsys.readouterr().err
    assert f"{source}: not valid YAML at line 3" in err


def test_libyaml_reads_what_pyyamls_scanner_refuses_and_the_document_is_kept() -> None:
    """The documented difference of the fast check: a tab after a plain value (which kubectl's
    YAML reader, derived from libyaml, accepts too) is refused by PyYAML's own scanner."""
    text = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {}\t\n"
    with pytest.raises(documents.DocumentError):
        documents.parse_all(text)
    if documents.FAST:
        assert documents.parse_all_fast(text) == [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}, "spec": {}}
        ]
    policy = gitops.Policy.default()
    tree = gitops.convert_tree(
        [(gitops.PurePosixPath("a.yaml"), text)],
        policy=policy,
        mode="enabled",
        namespace=None,
        native_extended=frozenset(),
        read_all=False,
    )
    if documents.FAST:
        assert tree.problems == [] and tree.files[0].output is None


def test_a_file_found_invalid_late_no_longer_counts_in_the_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its quota was read first (GPU text), the invalid document only when converting: the
    tree is converted again without the file, as when the whole file was read up front."""
    (tmp_path / "a.yaml").write_text(
        "apiVersion: v1\nkind: ResourceQuota\nmetadata: {name: q, namespace: ml}\n"
        'spec: {hard: {requests.nvidia.com/gpu: "1"}}\n---\na: [\n'
    )
    (tmp_path / "b.yaml").write_text(
        GPU.replace("{key}", "nvidia.com/gpu").replace(
            "{name: infer}", "{name: infer, namespace: ml}"
        )
    )

    assert main(["convert", str(tmp_path)]) == 1

    out, err = capsys.readouterr()
    assert f"{tmp_path / 'a.yaml'}: not valid YAML at line 3" in err  # of its document
    assert "resourceClaimTemplateName" in out and "not converted" not in err

    (tmp_path / "a.yaml").write_text((tmp_path / "a.yaml").read_text().split("---")[0])
    assert main(["convert", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "not converted" in err and "resourceClaimTemplateName" not in out


# --- documents that conversion would only check are let go unread (yaml_text.says_nothing):
# a Service, a ConfigMap; anything that may be invalid, refused or a problem is read as before

SERVICE = """\
apiVersion: v1
kind: Service
metadata:
  name: web   # a comment
  namespace: ml
spec:
  selector: {app: web}
  ports:
    - port: 80
      targetPort: http
"""

MUST_BE_READ = {
    "invalid YAML": SERVICE + "  extra: [\n",
    "bad indentation": SERVICE + " wrong: 1\n",
    "a duplicate anchor": SERVICE + "x: &a 1\ny: &a 2\n",
    "an alias": SERVICE + "x: &a 1\ny: *a\n",
    "a tag": SERVICE + "x: !!python/name:os.system\n",
    "a merge key": SERVICE + "x: {<<: 1}\n",
    "a list as a key": SERVICE + "[a, b]: c\n",
    "a complex key": SERVICE + "? [a, b]\n: c\n",
    "an integer too long": SERVICE + "x: " + "9" * 5000 + "\n",
    "0b_ is refused": SERVICE + "x: 0b_\n",
    "._ is not a float": SERVICE + "x: ._\n",
    "too deep": SERVICE + "x: " + "[" * 101 + "]" * 101 + "\n",
    "too deep in block style": SERVICE
    + "".join(f"{'  ' * i}a:\n" for i in range(101))
    + "  " * 101
    + "b\n",
    "a second document": SERVICE + "...\n---\nkind: Deployment\n",
    "no apiVersion at the end": SERVICE + "apiVersion:\n",
    "apiVersion is no": "apiVersion: no\nkind: Service\n",
    "a List": "apiVersion: v1\nkind: List\nitems: [1]\n",
    "a Deployment": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {}\n",
    "a kind in escapes": 'apiVersion: apps/v1\nkind: "Deploy\\x6dent"\nspec: {}\n',
    "a Knative Service": "apiVersion: serving.knative.dev/v1\nkind: Service\nspec: 1\n",
    "a tab": SERVICE + "x:\t1\n",
    "a carriage return": SERVICE.replace("\n", "\r"),
    "kind first": "kind: Service\napiVersion: v1\n",
    "a list": "- apiVersion: v1\n",
    "a scalar": "apiVersion v1\n",
}


def _converted(texts: list[str]) -> Any:
    """What convert says and writes of a file of ``texts`` (or the exception it raises)."""
    try:
        tree = gitops.convert_tree(
            [(gitops.PurePosixPath("a.yaml"), "---\n".join(texts))],
            policy=gitops.Policy.default(),
            mode="enabled",
            namespace=None,
            native_extended=frozenset(),
            read_all=False,
        )
    except Exception as exc:  # noqa: BLE001 - compared, not handled
        return repr(exc)
    return tree.problems, tree.notes, [(f.output, f.error) for f in tree.files]


def _unread_and_read(monkeypatch: pytest.MonkeyPatch, texts: list[str]) -> tuple[Any, Any]:
    fast = _converted(texts)
    with monkeypatch.context() as patched:
        patched.setattr(yaml_text, "says_nothing", lambda text, kinds: False)
        read = _converted(texts)
    return fast, read


def test_a_document_that_only_needs_checking_is_let_go_unread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "in.yaml"
    gpu = GPU.replace("{key}", "nvidia.com/gpu")
    source.write_text(SERVICE + "---\n" + gpu)
    checked = _spy(monkeypatch, documents, "parse_all_fast")
    read = _spy(monkeypatch, documents, "parse_all")

    assert main(["convert", str(source)]) == 0

    out = capsys.readouterr().out
    assert out.startswith(SERVICE + "---\n") and "resourceClaimTemplateName" in out
    assert not any("kind: Service" in text for text in [*checked, *read])


@pytest.mark.parametrize("name", MUST_BE_READ)
def test_a_document_that_may_be_invalid_refused_or_a_problem_is_read(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = MUST_BE_READ[name]
    kinds = frozenset(w.key for w in gitops.policy_table(gitops.Policy.default()))
    assert not yaml_text.says_nothing(text, kinds)
    fast, read = _unread_and_read(monkeypatch, [SERVICE, text])
    assert fast == read


@pytest.mark.parametrize("seed", [5, 6])
def test_documents_let_go_unread_change_nothing_convert_says_or_writes(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutations of documents without GPU text: with or without the shortcut, convert names
    the same problems (invalid YAML, its line and column), notes and output."""
    import random

    chooser = random.Random(5)
    role = (
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: r}\n"
        'rules:\n- apiGroups: [""]\n  resources: [pods]\n  verbs: [get, list]\n'
    )
    config = "apiVersion: v1\nkind: ConfigMap\ndata:\n  run.sh: |\n    echo 1 > /x\n  n: '1'\n"
    seeds = [SERVICE, role, config] * 4 + [PLAIN, *MUST_BE_READ.values()]
    pieces = [*" :-#[]{},\"'|>&*!?%`\n\\", "- ", ": ", "\n  ", "...", "---", "<<", "0x_", "._"]
    skipped = 0
    kinds = frozenset(w.key for w in gitops.policy_table(gitops.Policy.default()))
    for _ in range(600):
        text = chooser.choice(seeds)
        for _ in range(chooser.randint(0, 3)):
            at = chooser.randrange(len(text) + 1)
            if chooser.random() < 0.6:
                text = text[:at] + chooser.choice(pieces) + text[at:]
            else:
                text = text[:at] + text[at + chooser.randint(1, 3) :]
        skipped += yaml_text.says_nothing(text, kinds)
        fast, read = _unread_and_read(monkeypatch, [SERVICE, text])
        assert fast == read, text
    assert skipped > 60
