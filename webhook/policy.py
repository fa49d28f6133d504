"""The webhook's policy: what legacy requests become, per cluster and per namespace.

The policy is a YAML file (mounted from a ConfigMap). It is validated completely on load and every
problem is reported with its key path (``namespaces.embeddings.gpu[1]: unknown profile '9g.1tb'``)
so that a bad new version can be refused while the last good one stays in force. Unknown keys are
errors: a typo must not silently change what pods get. The schema is documented in
docs/translation.md and webhook/policy.example.yaml.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from gpu_slicer.core import catalog
from gpu_slicer.core.errors import CatalogError
from gpu_slicer.kube import documents
from gpu_slicer.webhook.errors import PolicyError, WorkloadPathError
from gpu_slicer.webhook.suggest import did_you_mean
from gpu_slicer.webhook.workloads import Workload, opt_in, parse_path

Target = Literal["gpu-slicer", "nvidia"]
NativeMode = Literal["defer", "convert"]
NvlinkMode = Literal["prefer", "strict", "none"]

TARGETS: tuple[str, ...] = ("gpu-slicer", "nvidia")
NATIVE_MODES: tuple[str, ...] = ("defer", "convert")
NVLINK_MODES: tuple[str, ...] = ("prefer", "strict", "none")
MIG_FALLBACK_MODES: tuple[str, ...] = ("none", "larger")
QUOTA_MODES: tuple[str, ...] = ("leave", "deny")
QuotaMode = Literal["leave", "deny"]

WHOLE_GPU = "gpu"
"""In a chain, the token that stands for a whole GPU rather than a MIG profile."""

MAX_ALTERNATIVES = 8
"""The API's limit on ``firstAvailable`` subrequests."""

ALL_MODELS: tuple[str, ...] = tuple(catalog.model_keys())
"""The ``gpuModels`` in force when a policy names none: every catalog model, in catalog order."""

API_VERSION = "gpu-slicer.io/v1alpha1"
KIND = "Policy"
DEFAULT_GC_AFTER_S = 86400

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


@dataclass(frozen=True)
class MigFallback:
    """What follows a ``nvidia.com/mig-<profile>`` request in its chain.

    ``mode`` "none": only the profile asked for; "larger": then every larger profile of the GPU
    models that offer it, smallest first. ``explicit`` maps a profile to its own fallbacks and wins
    over ``mode`` for the profiles it names.
    """

    mode: Literal["none", "larger"] = "none"
    explicit: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))

    def __hash__(self) -> int:
        # The mapping is read-only (a MappingProxyType over a dict of tuples): hashable by
        # value, so rules that hold it can key the translation's caches.
        return hash((self.mode, tuple(self.explicit.items())))

    def fallbacks_for(self, profile: str) -> tuple[str, ...] | None:
        """Explicit fallbacks of ``profile``; None when ``mode`` decides."""
        return self.explicit.get(profile)


@dataclass(frozen=True)
class NamespaceRules:
    """The rules in force in one namespace (cluster defaults merged with its overrides)."""

    gpu: tuple[str, ...] | None
    """What ``nvidia.com/gpu: 1`` means here (profiles, or "gpu"); None: a whole GPU."""
    nvlink: NvlinkMode
    mig_fallback: MigFallback
    gpu_models: tuple[str, ...] = ALL_MODELS
    """Catalog keys of the GPU models the cluster has (catalog order): chains use only their
    profiles, and a profile none of them offers is denied."""
    full_gpu_mig: bool = True
    """Whole-GPU chains end with the MIG instance that spans a GPU, for nodes whose GPUs run
    in MIG mode and so publish no whole-GPU device (Ampere)."""


@dataclass(frozen=True)
class NamespacePolicy:
    """Overrides for one namespace; None means "as the cluster default"."""

    gpu: tuple[str, ...] | None = None
    nvlink: NvlinkMode | None = None
    mig_fallback: MigFallback | None = None
    gpu_models: tuple[str, ...] | None = None
    full_gpu_mig: bool | None = None


@dataclass(frozen=True)
class Policy:
    """A validated, immutable policy."""

    target: Target = "gpu-slicer"
    native_extended_resources: NativeMode = "defer"
    template_gc_after_s: int = DEFAULT_GC_AFTER_S
    nvlink: NvlinkMode = "prefer"
    mig_fallback: MigFallback = field(default_factory=MigFallback)
    gpu_models: tuple[str, ...] = ALL_MODELS
    full_gpu_mig: bool = True
    namespaces: Mapping[str, NamespacePolicy] = field(default_factory=lambda: MappingProxyType({}))
    workloads: tuple[Workload, ...] = ()
    """Kinds ``convert`` and ``plan`` read pod templates from, beyond the built-in table."""
    quota_without_device_limit: QuotaMode = "leave"
    """A pod whose legacy GPUs a ResourceQuota limits, in a namespace with no DRA quota for
    the classes its claim would use: left unconverted with a warning, or denied."""

    @classmethod
    def default(cls) -> Policy:
        """The policy in force when no file is given: convert to gpu-slicer, no right-sizing."""
        return cls()

    def for_namespace(self, namespace: str) -> NamespaceRules:
        """The effective rules in ``namespace``."""
        override = self.namespaces.get(namespace)
        if override is None:
            return self._cluster_rules
        return NamespaceRules(
            gpu=override.gpu,
            nvlink=override.nvlink or self.nvlink,
            mig_fallback=override.mig_fallback or self.mig_fallback,
            gpu_models=override.gpu_models or self.gpu_models,
            full_gpu_mig=(
                self.full_gpu_mig if override.full_gpu_mig is None else override.full_gpu_mig
            ),
        )

    @cached_property
    def _cluster_rules(self) -> NamespaceRules:
        """The rules of every namespace without overrides, built once per (immutable) policy."""
        return NamespaceRules(
            gpu=None,
            nvlink=self.nvlink,
            mig_fallback=self.mig_fallback,
            gpu_models=self.gpu_models,
            full_gpu_mig=self.full_gpu_mig,
        )

    def describe(self) -> str:
        """One line for logs and ``policy check``."""
        names = ", ".join(sorted(self.namespaces)) or "none"
        models = "all" if self.gpu_models == ALL_MODELS else ",".join(self.gpu_models)
        return (
            f"target={self.target} nativeExtendedResources={self.native_extended_resources} "
            f"nvlink={self.nvlink} migFallback={self.mig_fallback.mode}"
            f"{'+explicit' if self.mig_fallback.explicit else ''} "
            f"templateGcAfter={self.template_gc_after_s}s gpuModels={models} "
            f"fullGpuMig={str(self.full_gpu_mig).lower()} "
            f"quotaWithoutDeviceLimit={self.quota_without_device_limit} "
            f"namespaces: {names}"
            + (f" workloads: {len(self.workloads)}" if self.workloads else "")
        )


def known_profiles() -> list[str]:
    """Every MIG profile name of the catalog, in catalog order."""
    return catalog.all_profile_names()


def is_known_profile(name: str) -> bool:
    return name in _PROFILE_SET


_PROFILE_SET = frozenset(catalog.all_profile_names())


@functools.cache
def model_profiles(gpu_models: tuple[str, ...]) -> tuple[str, ...]:
    """Every profile name the models ``gpu_models`` (catalog keys) offer, in catalog order.

    Cached: a policy has a handful of model sets and the translation asks on every pod.
    """
    return tuple(
        dict.fromkeys(p.name for m in catalog.MODELS if m.key in gpu_models for p in m.profiles)
    )


@functools.cache
def full_gpu_profiles(gpu_models: tuple[str, ...]) -> tuple[str, ...]:
    """The MIG profile that spans the whole GPU (all memory and compute slices) on each of
    ``gpu_models``, in catalog order without repeats: ``7g.80gb`` on an A100 80GB or H100,
    ``4g.24gb`` on an A30. No catalog profile spans one model and not another, so the name
    alone selects it (tests/webhook/test_policy.py checks that against the catalog)."""
    return tuple(
        dict.fromkeys(
            p.name
            for m in catalog.MODELS
            if m.key in gpu_models
            for p in m.profiles
            if catalog.is_full_gpu_profile(m, p)
        )
    )


@functools.cache
def model_profile_set(gpu_models: tuple[str, ...]) -> frozenset[str]:
    """``model_profiles`` as a set, for membership tests."""
    return frozenset(model_profiles(gpu_models))


# --- loading --------------------------------------------------------------------------------

_TOP_KEYS = (
    "apiVersion",
    "kind",
    "target",
    "nativeExtendedResources",
    "templateGcAfter",
    "nvlink",
    "migFallback",
    "gpuModels",
    "fullGpuMig",
    "namespaces",
    "workloads",
    "quotaWithoutDeviceLimit",
)
_WORKLOAD_KEYS = ("group", "kind", "podTemplates", "podSpecs", "convert")
_NAMESPACE_KEYS = ("gpu", "nvlink", "migFallback", "gpuModels", "fullGpuMig")


def load_policy(text: str, *, source: str = "<policy>") -> Policy:
    """Parse and validate a policy document; raises PolicyError listing every problem."""
    try:
        data = documents.parse(text)
    except documents.DocumentError as exc:
        raise PolicyError([str(exc)], source=source) from exc
    if data is None:
        return Policy.default()
    problems: list[str] = []
    policy = _parse(data, problems)
    if problems or policy is None:
        raise PolicyError(problems, source=source)
    return policy


def load_policy_file(path: str | Path) -> Policy:
    """Read and validate a policy file; an unreadable file is a PolicyError too."""
    source = str(path)
    try:
        text = documents.read_text(path)
    except documents.DocumentError as exc:
        raise PolicyError([str(exc)], source=source) from exc
    return load_policy(text, source=source)


def _parse(data: Any, problems: list[str]) -> Policy | None:
    if not isinstance(data, dict):
        problems.append(f"the policy must be a mapping of keys, not {_kind(data)}")
        return None
    _unknown_keys(data, _TOP_KEYS, "", problems)
    if "apiVersion" in data and data["apiVersion"] != API_VERSION:
        problems.append(f"apiVersion: must be {API_VERSION!r}, not {data['apiVersion']!r}")
    if "kind" in data and data["kind"] != KIND:
        problems.append(f"kind: must be {KIND!r}, not {data['kind']!r}")
    target = _choice(data, "target", TARGETS, "gpu-slicer", "target", problems)
    native = _choice(
        data, "nativeExtendedResources", NATIVE_MODES, "defer", "nativeExtendedResources", problems
    )
    nvlink = _choice(data, "nvlink", NVLINK_MODES, "prefer", "nvlink", problems)
    gc_after = DEFAULT_GC_AFTER_S
    if "templateGcAfter" in data:
        gc_after = _duration(data["templateGcAfter"], "templateGcAfter", problems)
    mig_fallback = MigFallback()
    if "migFallback" in data:
        mig_fallback = _mig_fallback(data["migFallback"], "migFallback", problems)
    gpu_models = ALL_MODELS
    if "gpuModels" in data:
        gpu_models = _gpu_models(data["gpuModels"], "gpuModels", problems) or ALL_MODELS
    _check_offered(mig_fallback, None, gpu_models, "", "gpuModels", problems)
    full_gpu_mig = _flag(data, "fullGpuMig", "fullGpuMig", problems)
    namespaces = _namespaces(data.get("namespaces"), gpu_models, mig_fallback, problems)
    if target == "nvidia":
        _check_no_strict(nvlink, namespaces, problems)
    workloads = _workloads(data.get("workloads"), problems)
    quota = _choice(
        data, "quotaWithoutDeviceLimit", QUOTA_MODES, "leave", "quotaWithoutDeviceLimit", problems
    )
    return Policy(
        target=target,  # type: ignore[arg-type]
        native_extended_resources=native,  # type: ignore[arg-type]
        template_gc_after_s=gc_after,
        nvlink=nvlink,  # type: ignore[arg-type]
        mig_fallback=mig_fallback,
        gpu_models=gpu_models,
        full_gpu_mig=True if full_gpu_mig is None else full_gpu_mig,
        namespaces=MappingProxyType(namespaces),
        workloads=workloads,
        quota_without_device_limit=quota,  # type: ignore[arg-type]
    )


_PATHS = ("podTemplates", "podSpecs")


def _paths(listed: Any, path: str, problems: list[str]) -> tuple[tuple[str, ...], ...]:
    """A list of paths (``spec.tasks[].template``), each checked."""
    if not isinstance(listed, list):
        problems.append(f"{path}: must be a list of paths, not {_kind(listed)}")
        return ()
    parsed = []
    for j, text in enumerate(listed):
        try:
            parsed.append(parse_path(text))
        except WorkloadPathError as exc:
            problems.append(f"{path}[{j}]: {exc}")
    return tuple(parsed)


def _workloads(raw: Any, problems: list[str]) -> tuple[Workload, ...]:
    """The ``workloads`` list: other kinds' pod templates, by API group and kind."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        problems.append(
            f"workloads: must be a list of {{group, kind, podTemplates}}, not {_kind(raw)}"
        )
        return ()
    found: list[Workload] = []
    seen: set[tuple[str, str]] = set()
    for i, body in enumerate(raw):
        path = f"workloads[{i}]"
        if not isinstance(body, dict):
            problems.append(f"{path}: must be a mapping with keys {', '.join(_WORKLOAD_KEYS)}")
            continue
        _unknown_keys(body, _WORKLOAD_KEYS, path + ".", problems)
        group, kind = body.get("group", ""), body.get("kind")
        if not isinstance(group, str) or "/" in group:
            problems.append(
                f"{path}.group: an API group such as example.com ('' for core), not {group!r}"
            )
            continue
        if not isinstance(kind, str) or not kind:
            problems.append(f"{path}.kind: required, the object's kind (such as TrainingJob)")
            continue
        if (group, kind) in seen:
            problems.append(f"{path}: {kind} of group {group!r} is listed twice")
            continue
        seen.add((group, kind))
        if "convert" in body and not isinstance(body["convert"], bool):
            problems.append(f"{path}.convert: must be true or false, not {body['convert']!r}")
            continue
        if body.get("convert") is False:
            found.append(Workload(group, kind, note="the policy's workloads leave this kind alone"))
            continue
        paths = {key: _paths(body.get(key, []), f"{path}.{key}", problems) for key in _PATHS}
        if not paths["podTemplates"] and not paths["podSpecs"]:
            known = opt_in(group, kind)
            if known is None:
                problems.append(
                    f"{path}: give podTemplates or podSpecs (paths such as spec.template); only "
                    "an operator's kind gpu-slicer knows can be opted in by group and kind alone"
                )
            else:
                found.append(known)
            continue
        found.append(
            Workload(group, kind, paths["podTemplates"], paths["podSpecs"], checked="policy")
        )
    return tuple(found)


def _namespaces(
    raw_ns: Any,
    cluster_models: tuple[str, ...],
    cluster_fallback: MigFallback,
    problems: list[str],
) -> dict[str, NamespacePolicy]:
    """The ``namespaces`` map; entries whose name is no namespace name are left out."""
    namespaces: dict[str, NamespacePolicy] = {}
    if raw_ns is None:
        return namespaces
    if not isinstance(raw_ns, dict):
        problems.append(f"namespaces: must be a mapping of namespace names, not {_kind(raw_ns)}")
        return namespaces
    for name, body in raw_ns.items():
        path = f"namespaces.{name}"
        if not isinstance(name, str) or not _DNS_LABEL.match(name):
            problems.append(f"{path}: {name!r} is not a valid namespace name (DNS label)")
            continue
        namespaces[name] = _namespace(body, path, cluster_models, cluster_fallback, problems)
    return namespaces


def _check_no_strict(
    nvlink: str, namespaces: dict[str, NamespacePolicy], problems: list[str]
) -> None:
    """Target nvidia publishes no NVLink attribute, so a strict NVLink chain could never match."""
    strict = [("nvlink", nvlink)] + [
        (f"namespaces.{n}.nvlink", ns.nvlink) for n, ns in namespaces.items()
    ]
    for path, mode in strict:
        if mode == "strict":
            problems.append(
                f"{path}: strict needs an NVLink attribute, which target nvidia does not "
                "publish; use prefer or none"
            )


def _namespace(
    body: Any,
    path: str,
    cluster_models: tuple[str, ...],
    cluster_fallback: MigFallback,
    problems: list[str],
) -> NamespacePolicy:
    if body is None:
        return NamespacePolicy()
    if not isinstance(body, dict):
        problems.append(f"{path}: must be a mapping with keys {', '.join(_NAMESPACE_KEYS)}")
        return NamespacePolicy()
    _unknown_keys(body, _NAMESPACE_KEYS, path + ".", problems)
    gpu = None
    if "gpu" in body:
        gpu = _chain(body["gpu"], f"{path}.gpu", problems, allow_whole=True)
    nvlink = None
    if "nvlink" in body:
        nvlink = _choice(body, "nvlink", NVLINK_MODES, "prefer", f"{path}.nvlink", problems)
    fallback = None
    if "migFallback" in body:
        fallback = _mig_fallback(body["migFallback"], f"{path}.migFallback", problems)
    models = None
    if "gpuModels" in body:
        models = _gpu_models(body["gpuModels"], f"{path}.gpuModels", problems)
    in_force = models or cluster_models
    models_path = f"{path}.gpuModels" if models else "gpuModels"
    # The cluster's own migFallback was checked against the cluster's models already.
    checked = fallback or (cluster_fallback if models else MigFallback())
    _check_offered(
        checked, gpu, in_force, path + ".", models_path, problems, inherited=fallback is None
    )
    return NamespacePolicy(
        gpu=gpu,
        nvlink=nvlink,  # type: ignore[arg-type]
        mig_fallback=fallback,
        gpu_models=models,
        full_gpu_mig=_flag(body, "fullGpuMig", f"{path}.fullGpuMig", problems),
    )


def _gpu_models(value: Any, path: str, problems: list[str]) -> tuple[str, ...] | None:
    """Catalog keys (catalog order) of a ``gpuModels`` list of keys or aliases; None if bad."""
    keys = catalog.model_keys()
    known = f"known models: {', '.join(keys)}"
    if not isinstance(value, list) or not value:
        problems.append(f"{path}: must be a non-empty list of GPU models; {known}")
        return None
    seen: set[str] = set()
    ok = True
    for index, item in enumerate(value):
        item_path = f"{path}[{index}]"
        if not isinstance(item, str):
            problems.append(f"{item_path}: must be a GPU model name, not {_kind(item)}; {known}")
            ok = False
            continue
        try:
            model = catalog.get_model(item)
        except CatalogError:
            hint = did_you_mean([item], keys, where="gpu-slicer catalog")
            problems.append(f"{item_path}: unknown GPU model {item!r}; {hint}")
            ok = False
            continue
        if model.key in seen:
            problems.append(f"{item_path}: {item!r} names {model.key} a second time")
            ok = False
            continue
        seen.add(model.key)
    if not ok:
        return None
    return tuple(k for k in keys if k in seen)


def _check_offered(
    fallback: MigFallback,
    gpu: tuple[str, ...] | None,
    gpu_models: tuple[str, ...],
    prefix: str,
    models_path: str,
    problems: list[str],
    *,
    inherited: bool = False,
) -> None:
    """Profiles the policy itself lists must be ones the models in force offer: a chain entry
    no GPU of the cluster has would never be allocated."""
    if gpu_models == ALL_MODELS:
        return
    offered = model_profile_set(gpu_models)
    listed: list[tuple[str, str]] = []
    if gpu is not None:
        listed += [(f"{prefix}gpu[{i}]", name) for i, name in enumerate(gpu)]
    # An inherited migFallback is named by its own key, with the namespace it is checked for.
    where = "migFallback" if inherited else f"{prefix}migFallback"
    suffix = f" (in force in {prefix.rstrip('.')})" if inherited and prefix else ""
    for profile, chain in fallback.explicit.items():
        listed.append((f"{where}.explicit.{profile}{suffix}", profile))
        listed += [(f"{where}.explicit.{profile}[{i}]{suffix}", n) for i, n in enumerate(chain)]
    for key_path, name in listed:
        if name != WHOLE_GPU and name not in offered:
            hint = did_you_mean(
                [name], model_profiles(gpu_models), where="gpu-slicer catalog --gpu MODEL"
            )
            problems.append(
                f"{key_path}: profile {name!r} is not offered by {models_path} "
                f"({', '.join(gpu_models)}); {hint}"
            )


def _mig_fallback(value: Any, path: str, problems: list[str]) -> MigFallback:
    if isinstance(value, str):
        if value not in MIG_FALLBACK_MODES:
            problems.append(
                f"{path}: {value!r} is not one of {', '.join(MIG_FALLBACK_MODES)} "
                "(or a mapping of profile to fallback profiles)"
            )
            return MigFallback()
        return MigFallback(mode=value)  # type: ignore[arg-type]
    if isinstance(value, dict):
        _unknown_keys(value, ("mode", "explicit"), path + ".", problems)
        mode = _choice(value, "mode", MIG_FALLBACK_MODES, "none", f"{path}.mode", problems)
        explicit: dict[str, tuple[str, ...]] = {}
        raw = value.get("explicit", {})
        if not isinstance(raw, dict):
            problems.append(f"{path}.explicit: must map a profile to a list of fallback profiles")
            raw = {}
        for profile, fallbacks in raw.items():
            key_path = f"{path}.explicit.{profile}"
            if not isinstance(profile, str) or not is_known_profile(profile):
                problems.append(f"{key_path}: unknown profile {profile!r}; {_hint(profile)}")
                continue
            chain = _chain(
                fallbacks, key_path, problems, allow_whole=True, limit=MAX_ALTERNATIVES - 1
            )
            if chain is not None:
                explicit[profile] = chain
        return MigFallback(mode=mode, explicit=MappingProxyType(explicit))  # type: ignore[arg-type]
    problems.append(
        f"{path}: must be one of {', '.join(MIG_FALLBACK_MODES)} or a mapping with keys "
        f"mode, explicit; not {_kind(value)}"
    )
    return MigFallback()


def _chain(
    value: Any,
    path: str,
    problems: list[str],
    *,
    allow_whole: bool,
    limit: int = MAX_ALTERNATIVES,
) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not value:
        problems.append(f"{path}: must be a non-empty list of MIG profile names")
        return None
    if len(value) > limit:
        problems.append(f"{path}: {len(value)} entries; at most {limit} are allowed")
    names: list[str] = []
    for index, item in enumerate(value):
        item_path = f"{path}[{index}]"
        if not isinstance(item, str):
            problems.append(f"{item_path}: must be a profile name, not {_kind(item)}")
            continue
        if item == WHOLE_GPU and allow_whole:
            pass
        elif not is_known_profile(item):
            problems.append(f"{item_path}: unknown profile {item!r}; {_hint(item)}")
            continue
        if item in names:
            problems.append(f"{item_path}: {item!r} is listed twice")
            continue
        names.append(item)
    return tuple(names)


def _choice(
    data: dict[str, Any],
    key: str,
    allowed: tuple[str, ...],
    default: str,
    path: str,
    problems: list[str],
) -> str:
    if key not in data:
        return default
    value = data[key]
    if value not in allowed:
        problems.append(f"{path}: {value!r} is not one of {', '.join(allowed)}")
        return default
    return str(value)


def _duration(value: Any, path: str, problems: list[str]) -> int:
    if isinstance(value, bool):
        problems.append(f"{path}: must be seconds or a duration like 24h, 90m, 1h30m")
        return DEFAULT_GC_AFTER_S
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str) and value and (match := _DURATION.match(value)):
        hours, minutes, secs = (int(g) if g else 0 for g in match.groups())
        seconds = hours * 3600 + minutes * 60 + secs
    else:
        problems.append(f"{path}: {value!r} is not seconds or a duration like 24h, 90m, 1h30m")
        return DEFAULT_GC_AFTER_S
    if seconds < 60:
        problems.append(f"{path}: {seconds}s is too short; at least 60 seconds")
        return DEFAULT_GC_AFTER_S
    return seconds


def _unknown_keys(
    data: dict[Any, Any], allowed: tuple[str, ...], prefix: str, problems: list[str]
) -> None:
    for key in data:
        if key not in allowed:
            problems.append(f"{prefix}{key}: unknown key; valid keys: {', '.join(allowed)}")


def _hint(name: Any) -> str:
    """The nearest catalog profiles to a mistyped one (every name when none is close)."""
    return did_you_mean([str(name)], known_profiles(), where="gpu-slicer catalog")


def _flag(data: dict[str, Any], key: str, path: str, problems: list[str]) -> bool | None:
    """A true/false key; None when absent (or wrong, with the problem recorded)."""
    if key not in data:
        return None
    value = data[key]
    if not isinstance(value, bool):
        problems.append(f"{path}: must be true or false, not {value!r}")
        return None
    return value


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
