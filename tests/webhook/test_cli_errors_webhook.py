"""Bad input to `gpu-slicer convert` and `webhook serve`: a message naming the problem, never a
traceback, and never a cluster contacted before the files are checked. Bad flags exit 2; a
document `convert` cannot read is named and kept as it was (exit 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_slicer.cli.main import main


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


POD_HEAD = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("- 1\n- 2\n", "document 1 (list): a list, not a Kubernetes object"),
        ("hello\n", "a string 'hello', not a Kubernetes object"),
        ("apiVersion: v1\nkind: List\nitems: 5\n", "items must be a list of objects"),
        ("apiVersion: v1\nkind: List\nitems: [5]\n", "a number 5, not a Kubernetes object"),
        (POD_HEAD + "spec: 5\n", "spec: must be a mapping with containers, not number 5"),
        (POD_HEAD + "spec: {containers: x}\n", "spec.containers: must be a list of containers"),
        (POD_HEAD + "spec: {containers: [5]}\n", "spec.containers[0]: must be a container"),
        (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {replicas: 1}\n",
            "spec.template: no pod template",
        ),
    ],
)
def test_convert_names_documents_it_cannot_read_and_keeps_them(
    text: str, named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.yaml"
    source.write_text(text)
    code = main(["convert", str(source)])
    out, err = capsys.readouterr()
    assert code == 1
    assert named in err and "left as it was" in err
    assert out == text


def test_convert_names_the_file_and_line_of_bad_yaml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.yaml"
    source.write_text("a: [\n")
    code, err = run(["convert", str(source)], capsys)
    assert code == 1
    assert f"{source}: not valid YAML at line 2" in err
    assert "<unicode string>" not in err


def test_convert_refuses_an_invalid_namespace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.yaml"
    source.write_text(POD_HEAD + "spec: {containers: []}\n")
    code, err = run(["convert", str(source), "-n", "Bad NS"], capsys)
    assert code == 2
    assert "--namespace 'Bad NS'" in err


def test_serve_names_a_config_file_that_is_not_utf8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_bytes(b"\xff\xfe\x00bad")
    code, err = run(["webhook", "serve", "--config", str(config)], capsys)
    assert code == 2
    assert f"config file {config}: not UTF-8" in err


def test_serve_names_missing_empty_and_folder_certificates_before_any_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    code, err = run(
        ["webhook", "serve", "--tls-cert", str(tmp_path / "nope.pem"), "--tls-key", str(empty)],
        capsys,
    )
    assert code == 2
    assert f"--tls-cert {tmp_path / 'nope.pem'}: cannot load: no such file" in err
    assert f"--tls-key {empty}: cannot load: the file is empty" in err
    assert "Kubernetes credentials" not in err
    code, err = run(
        ["webhook", "serve", "--tls-cert", str(tmp_path), "--tls-key", str(empty)], capsys
    )
    assert code == 2
    assert f"--tls-cert {tmp_path}: cannot load: not a file" in err


DEEP = "[" * 20000 + "]" * 20000


@pytest.mark.parametrize(
    "argv",
    [
        ["convert", "{deep}"],
        ["policy", "check", "{deep}"],
        ["convert", "{pod}", "--policy", "{deep}"],
        ["webhook", "serve", "--config", "{deep}"],
    ],
)
def test_yaml_nested_too_deeply_is_named_not_a_crash(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text(DEEP)
    pod = tmp_path / "pod.yaml"
    pod.write_text(POD_HEAD + "spec: {containers: []}\n")
    code, err = run([a.format(deep=deep, pod=pod) for a in argv], capsys)
    assert code == (1 if argv == ["convert", "{deep}"] else 2)  # a manifest is kept, named
    assert str(deep) in err and "nested too deeply" in err


class _BinaryStdin:
    """stdin whose bytes are not UTF-8."""

    def __init__(self, data: bytes) -> None:
        import io

        self.buffer = io.BytesIO(data)

    def read(self) -> str:
        return self.buffer.read().decode("utf-8", "surrogateescape")


@pytest.mark.parametrize("argv", [["convert", "-"], ["policy", "check", "-"]])
def test_stdin_that_is_not_utf8_is_named(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", _BinaryStdin(b"\xff\xfe"))
    code, err = run(argv, capsys)
    assert code == 2
    assert "<stdin>" in err and "utf-8" in err


def test_policy_check_counts_one_problem_in_the_singular(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("- 1\n")
    code, err = run(["policy", "check", str(policy)], capsys)
    assert code == 2
    assert "invalid policy (1 problem):" in err


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (
            "apiVersion: v1\nkind: Pod\nmetadata: x\nspec: {containers: []}\n",
            "metadata: must be a mapping",
        ),
        (
            POD_HEAD.replace("p}", "p, namespace: 5}") + "spec: {containers: []}\n",
            "metadata.namespace: must be a string, not number 5",
        ),
        (
            POD_HEAD.replace("p}", "p, annotations: 5}") + "spec: {containers: []}\n",
            "metadata.annotations: must be a mapping",
        ),
        (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec:\n"
            "  template:\n    metadata: 5\n    spec: {containers: []}\n",
            "spec.template.metadata: must be a mapping",
        ),
        (
            POD_HEAD + "spec: {containers: [{name: c, resources: 5}]}\n",
            "spec.containers[0].resources: must be a mapping",
        ),
        (
            POD_HEAD + "spec: {containers: [{name: c, resources: {limits: 5}}]}\n",
            "spec.containers[0].resources.limits: must be a mapping",
        ),
        (
            "kind: Pod\nmetadata: {name: p}\nspec: {containers: []}\n",
            "document 1 (Pod p): no apiVersion: which API group's Pod is it?",
        ),
    ],
)
def test_convert_names_malformed_metadata_and_resources(
    text: str, named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.yaml"
    source.write_text(text)
    code, err = run(["convert", str(source)], capsys)
    assert code == 1
    assert named in err
