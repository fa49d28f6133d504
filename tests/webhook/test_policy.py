"""Policy files: defaults, every key, messages that name the key path, and `policy check`."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from gpu_slicer.cli.main import main
from gpu_slicer.core import catalog
from gpu_slicer.webhook.errors import PolicyError
from gpu_slicer.webhook.policy import (
    ALL_MODELS,
    Policy,
    full_gpu_profiles,
    load_policy,
    load_policy_file,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "webhook" / "policy.example.yaml"


def problems_of(text: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        load_policy(text)
    return list(info.value.problems)


def test_an_empty_policy_is_the_default() -> None:
    assert load_policy("") == Policy.default()
    default = Policy.default()
    assert (default.target, default.native_extended_resources, default.template_gc_after_s) == (
        "gpu-slicer",
        "defer",
        86400,
    )


def test_the_example_policy_loads_with_every_key() -> None:
    policy = load_policy_file(EXAMPLE)
    assert policy.target == "gpu-slicer"
    assert policy.template_gc_after_s == 24 * 3600
    assert policy.mig_fallback.fallbacks_for("1g.10gb") == ("1g.20gb", "2g.20gb")
    embeddings = policy.for_namespace("embeddings")
    assert embeddings.gpu == ("1g.10gb", "2g.20gb", "3g.40gb")
    training = policy.for_namespace("training")
    assert (training.nvlink, training.mig_fallback.mode) == ("strict", "larger")
    assert training.gpu_models == ("H100-80GB",)
    assert embeddings.gpu_models == ("A100-80GB", "H100-80GB")
    assert policy.quota_without_device_limit == "leave"
    (trainer,) = policy.workloads
    assert (trainer.group, trainer.kind) == ("training.example.com", "Trainer")
    assert trainer.templates == (
        ("spec", "runner", "template"),
        ("spec", "helpers", "[]", "template"),
    )


def test_namespaces_without_overrides_get_the_cluster_rules() -> None:
    policy = load_policy("nvlink: none\nnamespaces: {a: {gpu: [1g.10gb]}}")
    assert policy.for_namespace("other").gpu is None
    assert policy.for_namespace("other").nvlink == "none"
    assert policy.for_namespace("a").nvlink == "none"


def test_an_unknown_profile_is_reported_with_its_key_path() -> None:
    found = problems_of("namespaces:\n  embeddings:\n    gpu: [1g.10gb, 9g.1tb]\n")
    assert len(found) == 1
    assert found[0].startswith("namespaces.embeddings.gpu[1]: unknown profile '9g.1tb'")
    # nothing is close to 9g.1tb: the catalog command, not a list of every profile
    assert "gpu-slicer catalog lists them" in found[0] and "1g.10gb" not in found[0]


def test_a_mistyped_profile_gets_the_nearest_names() -> None:
    (problem,) = problems_of("namespaces: {embeddings: {gpu: [2g.20g]}}")
    assert problem.endswith("unknown profile '2g.20g'; did you mean '2g.20gb'?")


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("targte: nvidia", "targte: unknown key"),
        ("namespaces: {ml: {gpus: [1g.10gb]}}", "namespaces.ml.gpus: unknown key"),
        ("migFallback: {mode: none, extra: 1}", "migFallback.extra: unknown key"),
    ],
    ids=["top level", "namespace", "migFallback"],
)
def test_unknown_keys_are_rejected(text: str, path: str) -> None:
    assert any(p.startswith(path) for p in problems_of(text))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("target: amd", "target: 'amd' is not one of gpu-slicer, nvidia"),
        ("nativeExtendedResources: maybe", "nativeExtendedResources: 'maybe' is not one of"),
        ("nvlink: always", "nvlink: 'always' is not one of prefer, strict, none"),
        ("templateGcAfter: soon", "templateGcAfter: 'soon' is not seconds or a duration"),
        ("templateGcAfter: 5", "templateGcAfter: 5s is too short"),
        ("migFallback: bigger", "migFallback: 'bigger' is not one of none, larger"),
        ("migFallback: {explicit: {1g.99gb: [2g.20gb]}}", "migFallback.explicit.1g.99gb: unknown"),
        ("migFallback: {explicit: {1g.10gb: []}}", "migFallback.explicit.1g.10gb: must be a non"),
        (
            "namespaces: {ml: {gpu: [1g.10gb, 1g.10gb]}}",
            "namespaces.ml.gpu[1]: '1g.10gb' is listed",
        ),
        ("namespaces: {ml: {gpu: 1g.10gb}}", "namespaces.ml.gpu: must be a non-empty list"),
        ("namespaces: {Bad_NS: {}}", "namespaces.Bad_NS: 'Bad_NS' is not a valid namespace"),
        ("namespaces: {ml: {gpu: [1, 2]}}", "namespaces.ml.gpu[0]: must be a profile name"),
        ("apiVersion: v2", "apiVersion: must be 'gpu-slicer.io/v1alpha1'"),
        ("target: nvidia\nnvlink: strict", "nvlink: strict needs an NVLink attribute"),
        ("[1, 2]", "the policy must be a mapping"),
        ("a: [", "not valid YAML"),
    ],
)
def test_invalid_values_are_explained(text: str, message: str) -> None:
    found = problems_of(text)
    assert any(message in p for p in found), found


def test_more_than_eight_alternatives_are_refused() -> None:
    chain = "[1g.5gb, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb, 1g.20gb, 2g.20gb, 3g.40gb]"
    assert any("at most 8" in p for p in problems_of(f"namespaces: {{ml: {{gpu: {chain}}}}}"))


def test_every_problem_is_reported_at_once() -> None:
    assert len(problems_of("target: x\nnvlink: y\nfoo: 1")) == 3


def test_durations_accept_seconds_and_units() -> None:
    assert load_policy("templateGcAfter: 3600").template_gc_after_s == 3600
    assert load_policy("templateGcAfter: 1h30m").template_gc_after_s == 5400


def test_an_unreadable_policy_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy_file(tmp_path / "missing.yaml")


def test_policy_check_accepts_the_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "check", str(EXAMPLE)]) == 0
    assert "valid" in capsys.readouterr().out


def test_policy_check_exits_2_with_every_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text("target: amd\nnamespaces: {embeddings: {gpu: [9g.1tb]}}\n")
    assert main(["policy", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "target: 'amd'" in err
    assert "namespaces.embeddings.gpu[0]: unknown profile '9g.1tb'" in err


def test_policy_check_exits_2_on_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["policy", "check", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_policy_check_reads_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("nvlink: sometimes\n"))
    assert main(["policy", "check", "-"]) == 2
    assert "nvlink: 'sometimes'" in capsys.readouterr().err


# --- gpuModels ------------------------------------------------------------------------------


def test_gpu_models_default_to_every_catalog_model() -> None:
    assert load_policy("").for_namespace("any").gpu_models == tuple(catalog.model_keys())


def test_gpu_models_accept_keys_and_aliases_in_any_case_and_keep_catalog_order() -> None:
    policy = load_policy("gpuModels: [h100-80gb, A100-80GB, H200]")
    assert policy.for_namespace("any").gpu_models == ("A100-80GB", "H100-80GB", "H200-141GB")


def test_a_namespace_gpu_models_list_overrides_the_cluster_one() -> None:
    policy = load_policy(
        "gpuModels: [H100-80GB, A100-80GB]\n"
        "namespaces:\n  big: {gpuModels: [H200]}\n  small: {nvlink: none}\n"
    )
    assert policy.for_namespace("big").gpu_models == ("H200-141GB",)
    assert policy.for_namespace("small").gpu_models == ("A100-80GB", "H100-80GB")
    assert policy.for_namespace("other").gpu_models == ("A100-80GB", "H100-80GB")


@pytest.mark.parametrize(
    ("text", "start"),
    [
        ("gpuModels: [H100-80GB, H999]", "gpuModels[1]: unknown GPU model 'H999'"),
        ("namespaces: {ml: {gpuModels: [X1]}}", "namespaces.ml.gpuModels[0]: unknown GPU model"),
        ("gpuModels: H100-80GB", "gpuModels: must be a non-empty list"),
        ("gpuModels: []", "gpuModels: must be a non-empty list"),
        ("gpuModels: [H200, H200-141GB]", "gpuModels[1]: 'H200-141GB' names H200-141GB a second"),
    ],
    ids=["unknown", "unknown in a namespace", "not a list", "empty", "alias twice"],
)
def test_bad_gpu_models_are_refused_naming_the_key_and_the_known_models(
    text: str, start: str
) -> None:
    (problem,) = problems_of(text)
    assert problem.startswith(start)
    if "non-empty" in start:
        assert "known models: " in problem and "A100-80GB" in problem and "B200-180GB" in problem
    elif "unknown" in start:  # nothing close: the models are few enough to list
        assert "valid: " in problem and "A100-80GB" in problem and "B200-180GB" in problem


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("A100-80", "'A100-80GB'"), ("h200-141", "'H200-141GB'"), ("H100-80G", "'H100-80GB'")],
)
def test_a_mistyped_gpu_model_gets_the_nearest_names(typo: str, meant: str) -> None:
    (problem,) = problems_of(f"gpuModels: [{typo}]")
    assert f"did you mean {meant}" in problem
    assert "A30-24GB" not in problem


def test_full_gpu_mig_is_on_by_default_and_a_flag_per_cluster_and_namespace() -> None:
    policy = load_policy("fullGpuMig: false\nnamespaces: {a100: {fullGpuMig: true}, ml: {}}")
    assert Policy.default().full_gpu_mig
    assert not policy.for_namespace("other").full_gpu_mig
    assert not policy.for_namespace("ml").full_gpu_mig
    assert policy.for_namespace("a100").full_gpu_mig
    assert problems_of("fullGpuMig: 0") == ["fullGpuMig: must be true or false, not 0"]


def test_every_full_gpu_profile_spans_every_model_that_has_it() -> None:
    """The full-GPU alternative selects by profile name alone: that is only right while no
    model offers one of these names as a smaller instance."""
    full = set(full_gpu_profiles(ALL_MODELS))
    assert {"7g.80gb", "7g.40gb", "4g.24gb"} <= full
    for model in catalog.MODELS:
        spanning = [p.name for p in model.profiles if catalog.is_full_gpu_profile(model, p)]
        assert len(spanning) == 1, model.key
        for profile in model.profiles:
            if profile.name in full:
                assert catalog.is_full_gpu_profile(model, profile), (model.key, profile.name)


def test_policy_profiles_no_listed_model_offers_are_refused_with_the_valid_ones() -> None:
    found = problems_of(
        "gpuModels: [A100-80GB]\n"
        "migFallback: {explicit: {1g.10gb: [1g.18gb]}}\n"
        "namespaces: {ml: {gpuModels: [H200], gpu: [1g.18gb, 1g.10gb]}}\n"
    )
    assert found[0].startswith(
        "migFallback.explicit.1g.10gb[0]: profile '1g.18gb' is not offered by gpuModels"
    )
    assert found[0].endswith("did you mean '1g.10gb'?")
    assert any(
        p.startswith(
            "namespaces.ml.gpu[1]: profile '1g.10gb' is not offered by "
            "namespaces.ml.gpuModels (H200-141GB)"
        )
        for p in found
    )
    # The cluster's explicit fallbacks now apply in ml too, and ml's models lack 1g.10gb.
    assert any("(in force in namespaces.ml)" in p for p in found)
