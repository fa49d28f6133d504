"""The `gpu-slicer certs` commands: exit codes, messages, and what they leave behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_slicer.certs import cli as certs_cli
from gpu_slicer.certs import issue as certs_issue
from gpu_slicer.cli.main import build_parser, main
from gpu_slicer.kube.api import KubeApi
from gpu_slicer.kube.memory import InMemoryKubeApi
from tests.support.certs_cases import CONFIG, NAMESPACE, SECRET, SERVICE


def test_issue_writes_the_three_files_and_prints_a_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tls"
    code = main(
        [
            "certs",
            "issue",
            "--service",
            SERVICE,
            "--namespace",
            NAMESPACE,
            "--out",
            str(out),
            "--days",
            "7",
            "--ca-days",
            "30",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["dnsNames"] == [
        f"{SERVICE}.{NAMESPACE}.svc",
        f"{SERVICE}.{NAMESPACE}.svc.cluster.local",
    ]
    ca = certs_issue.load_certificate((out / "ca.crt").read_bytes())
    assert summary["caFingerprintSHA256"] == certs_issue.fingerprint(ca)
    leaf = certs_issue.load_certificate((out / "tls.crt").read_bytes())
    assert (leaf.not_valid_after_utc - leaf.not_valid_before_utc).days == 7


def test_issue_with_hosts_covers_a_webhook_reached_by_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tls"
    code = main(
        [
            "certs",
            "issue",
            "--service",
            SERVICE,
            "--namespace",
            NAMESPACE,
            "--out",
            str(out),
            "--host",
            "127.0.0.1",
            "--host",
            "webhook.example.org",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ipAddresses"] == ["127.0.0.1"]
    assert "webhook.example.org" in summary["dnsNames"]
    leaf = certs_issue.load_certificate((out / "tls.crt").read_bytes())
    assert certs_issue.ip_addresses(leaf) == ["127.0.0.1"]


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--service", "Web_Hook"], "not a valid Service name"),
        (["--host", "Not A Host"], "neither an IP address nor a DNS name"),
        (["--days", "40", "--ca-days", "30"], "cannot outlive its CA"),
    ],
    ids=["bad service name", "bad extra host", "CA shorter than leaf"],
)
def test_issue_refuses_bad_input_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], fragment: str
) -> None:
    args = [
        "certs",
        "issue",
        "--service",
        SERVICE,
        "--namespace",
        NAMESPACE,
        "--out",
        str(tmp_path / "tls"),
        *extra,
    ]
    assert main(args) == 2
    assert fragment in capsys.readouterr().err
    assert not (tmp_path / "tls").exists()


def test_issue_reports_an_unwritable_folder_with_exit_code_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    args = [
        "certs",
        "issue",
        "--service",
        SERVICE,
        "--namespace",
        NAMESPACE,
        "--out",
        str(tmp_path / "file" / "tls"),
    ]
    assert main(args) == 1
    assert "cannot write" in capsys.readouterr().err


def test_a_non_numeric_days_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "certs",
                "issue",
                "--service",
                SERVICE,
                "--namespace",
                NAMESPACE,
                "--out",
                "x",
                "--days",
                "soon",
            ]
        )
    assert exit_info.value.code == 2
    assert "'soon' is not a whole number" in capsys.readouterr().err


def _ensure_args(*extra: str) -> list[str]:
    return [
        "certs",
        "ensure",
        "--namespace",
        NAMESPACE,
        "--secret",
        SECRET,
        "--webhook-config",
        CONFIG,
        "--service",
        SERVICE,
        *extra,
    ]


def test_ensure_runs_once_against_the_api_it_is_given(
    api: InMemoryKubeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    args = build_parser().parse_args(_ensure_args())
    seen: list[str | None] = []

    def factory(kubeconfig: str | None) -> KubeApi:
        seen.append(kubeconfig)
        return api

    assert certs_cli.run_ensure(args, api_factory=factory) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["caCreated"] and summary["leafIssued"] and summary["bundlePatched"]
    assert seen == [None]
    assert certs_cli.run_ensure(args, api_factory=factory) == 0
    again = json.loads(capsys.readouterr().out)
    assert not (again["caCreated"] or again["leafIssued"] or again["bundlePatched"])


def test_ensure_with_a_window_longer_than_the_lifetime_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser().parse_args(_ensure_args("--days", "10", "--renew-before", "20"))
    assert certs_cli.run_ensure(args, api_factory=lambda _: InMemoryKubeApi()) == 2
    assert "--renew-before (20 days) must be shorter than --days (10)" in capsys.readouterr().err


def test_ensure_without_the_webhook_configuration_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser().parse_args(_ensure_args())
    assert certs_cli.run_ensure(args, api_factory=lambda _: InMemoryKubeApi()) == 1
    assert "not found" in capsys.readouterr().err


def test_ensure_flags_have_environment_twins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_SLICER_NAMESPACE", "other")
    monkeypatch.setenv("GPU_SLICER_SECRET", "s")
    monkeypatch.setenv("GPU_SLICER_WEBHOOK_CONFIG", "w")
    monkeypatch.setenv("GPU_SLICER_INTERVAL", "3600")
    monkeypatch.setenv("GPU_SLICER_RENEW_BEFORE", "10")
    args = build_parser().parse_args(["certs", "ensure"])
    settings = certs_cli.settings_from(args)
    assert (settings.namespace, settings.secret, settings.webhook_config) == ("other", "s", "w")
    assert args.interval == 3600.0 and settings.renew_before.days == 10
