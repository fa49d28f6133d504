"""``gpu-slicer status`` as a command: against the in-memory apiserver, read only; flags and
the one-line failures; the real client against a cluster that is not there."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from gpu_slicer.cli.main import build_parser, main
from gpu_slicer.core.identity import DRIVERS
from gpu_slicer.kube.errors import Forbidden, NotFound, Unavailable
from gpu_slicer.kube.memory import InMemoryKubeApi
from gpu_slicer.status import cli as status_cli
from tests.support.scaling_cases import RELEASES, check_note
from tests.support.status_fixtures import STATUS_SCHEMA


def _run(api: InMemoryKubeApi, argv: list[str], *, width: int = 80) -> int:
    args = build_parser().parse_args(["status", *argv])
    code: int = status_cli.run_status(args, api_factory=lambda _: api, width=width)
    return code


def test_status_prints_the_picture_and_namespaces_and_only_lists(
    cluster: InMemoryKubeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(cluster, []) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "a100: 1 GPU A100-SXM4-80GB, 1 of 8 memory slices free\n"
        "  0  mig      |free   |1g.10gb|1g.10gb|1g.10gb|3g.40gb "
    )
    assert "ml         enabled    5               5                 0" in out
    assert {(c.verb, c.kind) for c in cluster.calls} == {
        ("list", "ResourceSlice"),
        ("list", "ResourceClaim"),
        ("list", "Pod"),
        ("list", "Namespace"),
    }
    assert all(c.namespace is None for c in cluster.calls)  # every namespace


def test_status_json_follows_the_schema(
    cluster: InMemoryKubeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(cluster, ["-o", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    jsonschema.validate(document, STATUS_SCHEMA)
    assert [n["name"] for n in document["nodes"]] == ["a100", "h100"]


def test_node_limits_the_gpus_shown(
    cluster: InMemoryKubeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(cluster, ["--node", "h100", "-o", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [n["name"] for n in document["nodes"]] == ["h100"]
    # One list per driver name (this release's and 0.1's), each of that node's slices only.
    lists = [c.kind for c in cluster.calls if c.kind == "ResourceSlice"]
    assert lists == ["ResourceSlice"] * len(DRIVERS)


def test_a_node_without_gpu_slicer_devices_is_one_line_and_exit_1(
    cluster: InMemoryKubeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(cluster, ["--node", "cpu-1"]) == 1
    err = capsys.readouterr().err
    assert err == (
        "gpu-slicer status: node cpu-1 publishes no gpu-slicer ResourceSlices "
        "and no claim holds a device there\n"
    )


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (
            Unavailable("cannot reach the apiserver for GET /apis: connection refused"),
            "gpu-slicer status: cannot reach the cluster: cannot reach the apiserver",
        ),
        (
            NotFound("the server could not find the requested resource"),
            "gpu-slicer status: the apiserver does not serve ResourceSlice in resource.k8s.io/v1",
        ),
        (
            Forbidden("resourceslices is forbidden"),
            "gpu-slicer status: not allowed to list ResourceSlices in every namespace",
        ),
    ],
    ids=["unreachable", "no-dra", "forbidden"],
)
def test_a_cluster_that_cannot_be_read_is_one_line_and_exit_1(
    cluster: InMemoryKubeApi,
    capsys: pytest.CaptureFixture[str],
    error: Exception,
    says: str,
) -> None:
    cluster.fail_next("list", error)  # type: ignore[arg-type]
    assert _run(cluster, []) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(says) and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--node", "Bad_Name"], "gpu-slicer status: --node 'Bad_Name' is not a valid node name"),
        (
            ["--kubeconfig", "/nonexistent/kubeconfig"],
            "gpu-slicer status: --kubeconfig /nonexistent/kubeconfig does not exist",
        ),
        (["-o", "yaml"], "gpu-slicer status: argument -o/--output: invalid choice: 'yaml'"),
        (["--nodes", "x"], "gpu-slicer status: unrecognized arguments: --nodes x"),
    ],
    ids=["node", "kubeconfig", "output", "unknown-flag"],
)
def test_bad_flags_exit_2_with_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(["status", *argv])
    except SystemExit as exc:  # argparse's own errors
        code = int(str(exc.code))
    assert code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith(says)


def test_a_cluster_that_is_not_there_through_the_real_client_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    retries = logging.getLogger("urllib3.connectionpool")
    level = retries.level
    try:
        _unreachable(tmp_path, capsys)
    finally:
        retries.setLevel(level)  # the command quiets urllib3's retry warnings


def _unreachable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    assert main(["status", "--kubeconfig", str(kubeconfig)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpu-slicer status: cannot reach the cluster: ")
    assert err.count("\n") == 1


def test_a_kubeconfig_the_client_cannot_parse_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("clusters: [unclosed\n")
    assert main(["status", "--kubeconfig", str(kubeconfig)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpu-slicer status: ") and str(kubeconfig) in err


def test_importing_the_command_does_not_import_the_kubernetes_client_or_ssl() -> None:
    # The CLI parser is built in the webhook's gevent workers before gevent patches ssl.
    code = (
        "import sys, status.cli; "
        "bad = [m for m in ('ssl', 'urllib3', 'kubernetes') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2]
    )


@pytest.mark.parametrize(("version", "warned"), RELEASES)
def test_status_says_when_the_release_schedules_counters_with_quadratic_cost(
    cluster: InMemoryKubeApi,
    capsys: pytest.CaptureFixture[str],
    version: tuple[int, int],
    warned: bool,
) -> None:
    cluster.server_version = lambda: version  # type: ignore[method-assign]
    assert _run(cluster, ["-o", "json"]) == 0
    check_note(json.loads(capsys.readouterr().out)["notes"], warned=warned, nodes=2)
