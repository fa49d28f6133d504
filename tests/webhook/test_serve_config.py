"""Settings of ``webhook serve``: flags, environment twins, file, and the refusals (exit 2)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_slicer.cli.main import main
from gpu_slicer.webhook.config import ConfigError, ServerConfig


def test_every_setting_has_an_environment_twin_that_round_trips() -> None:
    config = ServerConfig(
        bind="127.0.0.1:9443",
        tls_cert="/c",
        tls_key="/k",
        workers=3,
        connections=8,
        dev=True,
        namespace_mode="audit",
        policy="/p.yaml",
        kubeconfig="/kc",
        policy_check_s=1.5,
        gc_interval_s=0,
    )
    env = config.to_env()
    assert all(key.startswith("GPU_SLICER_") for key in env)
    assert env["GPU_SLICER_TLS_CERT"] == "/c" and env["GPU_SLICER_DEV"] == "1"
    assert ServerConfig.from_env(env) == config


def test_the_environment_overrides_the_file_and_flags_override_the_environment(
    tmp_path: Path,
) -> None:
    settings = tmp_path / "settings.yaml"
    settings.write_text("bind: 0.0.0.0:1111\nworkers: 5\ntls-cert: /file.crt\n")
    env = {"GPU_SLICER_CONFIG": str(settings), "GPU_SLICER_WORKERS": "6"}
    from_env = ServerConfig.from_env(env)
    assert (from_env.bind, from_env.workers, from_env.tls_cert) == ("0.0.0.0:1111", 6, "/file.crt")
    flagged = ServerConfig.from_mapping({"workers": 7}, base=from_env, source="flags")
    assert flagged.workers == 7 and flagged.bind == "0.0.0.0:1111"


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"GPU_SLICER_WORKERS": "many"}, "whole number"),
        ({"GPU_SLICER_DEV": "perhaps"}, "boolean"),
    ],
)
def test_bad_environment_values_name_the_setting(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        ServerConfig.from_env(env)


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        (ServerConfig(), "--tls-cert and --tls-key"),
        (ServerConfig(tls_cert="/c"), "both --tls-cert and --tls-key"),
        (ServerConfig(dev=True, bind="8443"), "--bind"),
        (ServerConfig(dev=True, bind="1.2.3.4:99999"), "port 99999 is out of range"),
        (ServerConfig(tls_cert="/c", tls_key="/k", namespace_mode="audit"), "only applies"),
        (ServerConfig(dev=True, workers=0), "--workers"),
    ],
    ids=["no-tls", "half-tls", "bad-bind", "bad-port", "mode-outside-dev", "no-workers"],
)
def test_inconsistent_settings_are_refused_with_the_flag_named(
    config: ServerConfig, fragment: str
) -> None:
    assert any(fragment in problem for problem in config.problems())
    with pytest.raises(ConfigError):
        config.check()


def test_dev_mode_needs_no_certificate_and_defaults_to_enabled() -> None:
    config = ServerConfig(dev=True)
    assert config.problems() == []
    assert config.effective_namespace_mode == "enabled"
    assert not config.create_templates


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["webhook", "serve"], "--tls-cert"),
        (["webhook", "serve", "--dev", "--policy", "{policy}"], "invalid policy"),
        (["webhook", "serve", "--tls-cert", "{missing}", "--tls-key", "{missing}"], "cannot load"),
    ],
    ids=["no-tls", "bad-policy", "unreadable-certificate"],
)
def test_serve_exits_2_with_the_problem_before_starting(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    fragment: str,
) -> None:
    for key in [k for k in os.environ if k.startswith("GPU_SLICER_")]:
        monkeypatch.delenv(key)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: "
        "'https://127.0.0.1:1'}}]\nusers: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    monkeypatch.setenv("GPU_SLICER_KUBECONFIG", str(kubeconfig))
    policy = tmp_path / "policy.yaml"
    policy.write_text("target: somebody-else\n")
    args = [a.format(policy=policy, missing=tmp_path / "missing.pem") for a in argv]
    assert main(args) == 2
    assert fragment in capsys.readouterr().err
