"""Building chains: what each container that gets devices asks for, as a chain of
alternatives in preference order (from its legacy resource, the policy or an annotation)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from gpu_slicer.core import catalog, gpu_model
from gpu_slicer.core.identity import LEGACY_GPU, LEGACY_MIG_PREFIX
from gpu_slicer.kube.quantity import QuantityError, format_bytes, parse_bytes
from gpu_slicer.webhook.claims import Alternative
from gpu_slicer.webhook.errors import Denied
from gpu_slicer.webhook.policy import (
    ALL_MODELS,
    MAX_ALTERNATIVES,
    WHOLE_GPU,
    NamespaceRules,
    full_gpu_profiles,
    is_known_profile,
    model_profile_set,
    model_profiles,
)
from gpu_slicer.webhook.suggest import did_you_mean
from gpu_slicer.webhook.targets import TargetDriver
from gpu_slicer.webhook.translate.conversion import CHANGE_ANNOTATION, short
from gpu_slicer.webhook.translate.reading import (
    ANNOTATION_CONTAINERS,
    ANNOTATION_GPU_MEMORY,
    ANNOTATION_PROFILES,
    Facts,
    Shape,
    targeted,
)

Entry = tuple[str | tuple[str, ...], int | None]
"""A chain entry: a profile or ``gpu`` (or, last in a memory chain, any of several profiles)
and the minimum memory in bytes, or None."""

Builder = Callable[[int, bool], tuple[Alternative, ...]]
"""The chain of a kind of device for ``count`` devices; the flag says whether a container that
uses them wants several, which is when NVLink alternatives come first."""


@dataclass(eq=False)
class Need:
    """What one converted container asks for: ``count`` devices of one kind (``key``)."""

    container: Facts
    count: int
    what: str
    """The legacy resource converted, or "annotation"."""
    via: str | None
    key: tuple[Any, ...]
    """Containers with equal keys want the same devices, so they can pass them on."""
    build: Builder


def needs_of(
    shape: Shape, rules: NamespaceRules, target: TargetDriver, warnings: list[str]
) -> list[Need]:
    """What each container that gets devices asks for, in pod order."""
    annotations = dict(shape.annotations)
    containers = shape.containers
    chain = _annotation_chain(annotations, rules.gpu_models)
    chosen = targeted(annotations, containers, chain is not None)
    needs: list[Need] = []
    for container in containers:
        is_targeted = container in chosen
        if container.deferred and is_targeted:
            # A DeviceClass already gives this container devices for its legacy request;
            # a claim on top would give it a second set.
            is_targeted = False
            warnings.append(
                short(
                    f"{container.name}: left to the scheduler's DRA extended resources "
                    f"({', '.join(container.deferred)}); annotation not applied"
                )
            )
        if not is_targeted and not container.legacy:
            continue
        needs.append(_need(container, is_targeted, chain, rules, target, warnings))
    return needs


def _need(
    container: Facts,
    is_targeted: bool,
    chain: Chain | None,
    rules: NamespaceRules,
    target: TargetDriver,
    warnings: list[str],
) -> Need:
    """What one container asks for: its count, the kind of device (and its chain), what is
    converted (a legacy resource name or "annotation") and the annotation or policy that chose
    the chain, if one did."""
    legacy_name, legacy_count = container.legacy or (None, 1)
    if is_targeted and chain is not None:
        return _chain_need(
            container, legacy_count, legacy_name or CHANGE_ANNOTATION, chain.source, chain.entries
        )
    if legacy_name is None or legacy_name == LEGACY_GPU:
        # Named by gpu-slicer.io/containers without any chain: what nvidia.com/gpu: 1 means here.
        what, via = (
            (legacy_name, None) if legacy_name else (CHANGE_ANNOTATION, ANNOTATION_CONTAINERS)
        )
        if rules.gpu is not None:
            entries = tuple((n, None) for n in rules.gpu)
            return _chain_need(container, legacy_count, what, via, entries)
        if legacy_count > 1 and rules.nvlink != "none" and target.nvlink_attribute is None:
            warnings.append(
                short(
                    f"{container.name}: {legacy_count} GPUs without an NVLink constraint: target "
                    f"{target.name} publishes no NVLink attribute"
                )
            )
        full = full_gpu_profiles(rules.gpu_models) if rules.full_gpu_mig else ()
        build = partial(_gpu_chain, rules.nvlink, target.nvlink_attribute is not None, full)
        return Need(container, legacy_count, what, via, ("gpu",), build)
    models = rules.gpu_models
    profile = _profile_of_resource(legacy_name[len(LEGACY_MIG_PREFIX) :], models)
    if profile not in model_profile_set(models):
        raise Denied(
            f"container {container.name!r}: {legacy_name}: no GPU model offers MIG profile "
            f"{profile!r}{_models_note(models)}; {_suggest([profile], models)}"
        )
    fallbacks = rules.mig_fallback.fallbacks_for(profile)
    if fallbacks is None:
        larger = rules.mig_fallback.mode == "larger"
        fallbacks = _larger_profiles(profile, models) if larger else ()
    names = [profile, *(f for f in fallbacks if f != profile)][:MAX_ALTERNATIVES]
    via = "policy migFallback" if len(names) > 1 else None
    entries = tuple((n, None) for n in names)
    return _chain_need(container, legacy_count, legacy_name, via, entries)


def _chain_need(
    container: Facts, count: int, what: str, via: str | None, entries: tuple[Entry, ...]
) -> Need:
    """A need whose chain is a fixed list of profiles (or ``gpu``)."""
    return Need(container, count, what, via, ("chain", entries), partial(_fixed_chain, entries))


@dataclass(frozen=True)
class Chain:
    """The chain an annotation gives, and which annotation."""

    source: str
    entries: tuple[Entry, ...]


def _annotation_chain(annotations: dict[str, Any], models: tuple[str, ...]) -> Chain | None:
    profiles = annotations.get(ANNOTATION_PROFILES)
    memory = annotations.get(ANNOTATION_GPU_MEMORY)
    if profiles is not None and memory is not None:
        raise Denied(
            f"annotations {ANNOTATION_PROFILES} and {ANNOTATION_GPU_MEMORY} both given; "
            "use one: an explicit chain or a memory size"
        )
    if profiles is not None:
        chain = tuple((p, None) for p in _parse_profiles(profiles, models))
        return Chain(ANNOTATION_PROFILES, chain)
    if memory is not None:
        return Chain(ANNOTATION_GPU_MEMORY, _memory_chain(memory, models))
    return None


def _valid_chain_entries(models: tuple[str, ...]) -> str:
    return f"valid: {WHOLE_GPU} (a whole GPU), " + ", ".join(model_profiles(models))


def _models_note(models: tuple[str, ...]) -> str:
    """Where the valid names come from, when the policy narrows the catalog."""
    return "" if models == ALL_MODELS else f" (policy gpuModels: {', '.join(models)})"


def _suggest(names: Sequence[str], models: tuple[str, ...], *, whole_gpu: bool = False) -> str:
    """The valid names nearest to mistyped ones, rather than the list of every profile."""
    valid = ((WHOLE_GPU,) if whole_gpu else ()) + model_profiles(models)
    where = "`gpu-slicer catalog`" + (
        "" if models == ALL_MODELS else f" (models: {', '.join(models)})"
    )
    return did_you_mean(names, valid, where=where)


def _not_offered(names: Sequence[str], models: tuple[str, ...]) -> str:
    """``unknown profile 'x'`` or, for a catalog profile the models lack, says so."""
    quoted = ", ".join(repr(n) for n in names)
    if models == ALL_MODELS or not all(is_known_profile(n) for n in names):
        return f"unknown profile {quoted}"
    return f"profile {quoted} is not offered by the cluster's GPU models{_models_note(models)}"


def _gpu_models(models: tuple[str, ...]) -> tuple[gpu_model.GpuModel, ...]:
    return tuple(m for m in catalog.MODELS if m.key in models)


def _parse_profiles(raw: Any, models: tuple[str, ...]) -> list[str]:
    names = [n.strip() for n in str(raw).split(",")]
    if not all(names):
        raise Denied(
            f"annotation {ANNOTATION_PROFILES}: {str(raw)!r} has an empty entry; "
            f"{_valid_chain_entries(models)}"
        )
    if len(names) > MAX_ALTERNATIVES:
        raise Denied(
            f"annotation {ANNOTATION_PROFILES}: {len(names)} profiles; at most "
            f"{MAX_ALTERNATIVES} alternatives are allowed"
        )
    offered = model_profile_set(models)
    unknown = [n for n in names if n != WHOLE_GPU and n not in offered]
    if unknown:
        raise Denied(
            f"annotation {ANNOTATION_PROFILES}: {_not_offered(unknown, models)}; "
            f"{_suggest(unknown, models, whole_gpu=True)}"
        )
    if len(set(names)) != len(names):
        raise Denied(f"annotation {ANNOTATION_PROFILES}: {str(raw)!r} lists a profile twice")
    return names


def _memory_chain(raw: Any, models: tuple[str, ...]) -> tuple[Entry, ...]:
    try:
        wanted = parse_bytes(raw)
    except QuantityError as exc:
        raise Denied(
            f"annotation {ANNOTATION_GPU_MEMORY}: {exc}; give a size such as 12Gi or 40G"
        ) from exc
    entries = _memory_entries(wanted, models)
    if entries is None:
        model, largest = max(
            ((m, p) for m in _gpu_models(models) for p in m.profiles),
            key=lambda mp: mp[1].memory_bytes,
        )
        raise Denied(
            f"annotation {ANNOTATION_GPU_MEMORY}: no MIG profile has {raw} of memory; the largest "
            f"is {largest.name} ({format_bytes(largest.memory_bytes)}) on {model.key}"
            f"{_models_note(models)}"
        )
    return entries


def _memory_entries(wanted: int, models: tuple[str, ...]) -> tuple[Entry, ...] | None:
    """The memory chain for ``wanted`` bytes on ``models`` (None: none of their profiles has
    that much); depends only on the static catalog. Only the policy's models count.

    The chain is in tiers: the first entry is every model's smallest fitting profile, the second
    every model's second smallest, and so on (:func:`_tiers`). On a node of one GPU model the
    alternatives are thus exactly that model's fitting profiles, smallest first, as if the chain
    named only them, while the scheduler tries as few alternatives as the model needs: a chain
    that named every model's profiles one by one made an A100 node reject seven alternatives
    (each a CEL evaluation over every device) before reaching its own profile. On a node with
    several GPU models, a tier takes whichever model's slice comes first in the agent's device
    order.

    Every entry also selects on the memory capacity the node publishes (which the agent reads
    from NVML), not only on the profile name: a profile's memory differs by driver and model, so
    the catalog's figure only picks the candidates and the device's own capacity decides."""
    found = catalog.profiles_with_memory(wanted, _gpu_models(models))
    if not found:
        return None
    return tuple(
        (names[0] if len(names) == 1 else names, wanted)
        for names in _tiers(found)[:MAX_ALTERNATIVES]
    )


def _tiers(found: list[tuple[gpu_model.GpuModel, gpu_model.Profile]]) -> list[tuple[str, ...]]:
    """Profile names in tiers: a name's tier is one more than the longest run of smaller
    fitting profiles before it on any model, so each model's profiles fall in strictly
    increasing tiers and a tier holds at most one fitting profile of each model. Two models
    that order the same names oppositely (none in the catalog) would make that impossible:
    every name then gets a tier of its own, in memory order."""
    order = list(dict.fromkeys(profile.name for _model, profile in found))
    by_model: dict[str, list[str]] = {}
    for model, profile in found:
        by_model.setdefault(model.key, []).append(profile.name)
    tier = dict.fromkeys(order, 1)
    for _round in range(len(order)):
        changed = False
        for names in by_model.values():
            for smaller, larger in zip(names, names[1:], strict=False):
                if tier[larger] <= tier[smaller]:
                    tier[larger] = tier[smaller] + 1
                    changed = True
        if not changed:
            tiers: dict[int, list[str]] = {}
            for name in order:
                tiers.setdefault(tier[name], []).append(name)
            return [tuple(tiers[t]) for t in sorted(tiers)]
    return [(name,) for name in order]


def _larger_profiles(name: str, models: tuple[str, ...]) -> tuple[str, ...]:
    """Profiles bigger than ``name`` on those of ``models`` that offer it, smallest first
    (callers pass catalog profile names, so the keys are bounded by the catalog)."""
    found: list[tuple[int, int, str]] = []
    for model in _gpu_models(models):
        if not model.has_profile(name):
            continue
        base = model.profile(name)
        for profile in model.profiles:
            if profile.media_exclusive or profile.name == name:
                continue
            bigger = (profile.memory_bytes, profile.compute_slices) > (
                base.memory_bytes,
                base.compute_slices,
            )
            if bigger and profile.memory_bytes >= base.memory_bytes:
                found.append((profile.memory_bytes, profile.compute_slices, profile.name))
    return tuple(dict.fromkeys(n for _m, _c, n in sorted(found)))


def _profile_of_resource(token: str, models: tuple[str, ...]) -> str:
    """The MIG profile a ``nvidia.com/mig-<token>`` resource stands for.

    A resource name cannot hold ``+``, so the NVIDIA device plugin advertises ``1g.10gb+me`` as
    ``nvidia.com/mig-1g.10gb.me``: the dots after ``<g>g.<mem>gb`` were ``+``. A token that
    is a profile name as it is (or matches none either way) is returned unchanged.
    """
    offered = model_profile_set(models)
    if token in offered:
        return token
    parts = token.split(".")
    if len(parts) > 2:
        spelled = ".".join(parts[:2]) + "".join(f"+{p}" for p in parts[2:])
        if spelled in offered:
            return spelled
    return token


# --- the chains themselves -------------------------------------------------------------------


def _alternative(name: str | tuple[str, ...], count: int, min_memory: int | None) -> Alternative:
    """The alternative of one chain entry."""
    if isinstance(name, tuple):
        return Alternative("mig", count, None, min_memory, False, (), name)
    if name == WHOLE_GPU:
        return Alternative("gpu", count, None, None, False, (), ())
    return Alternative("mig", count, name, min_memory, False, (), ())


def _fixed_chain(entries: tuple[Entry, ...], count: int, _several: bool) -> tuple[Alternative, ...]:
    """A fixed chain for ``count`` devices (NVLink does not apply to it)."""
    return tuple(_alternative(p, count, memory) for p, memory in entries)


def _gpu_chain(
    nvlink: str, has_nvlink: bool, full: tuple[str, ...], count: int, several: bool
) -> tuple[Alternative, ...]:
    """Whole GPUs, then (``full``) MIG instances that span a GPU, for nodes in MIG mode.

    When a container wants several devices and the target publishes NVLink domains, policy
    ``nvlink`` prefer puts an NVLink-constrained twin before each (``gpu-nvlink, gpu,
    gpu-mig-nvlink, gpu-mig``), strict keeps only the twins.
    """
    plain = [_whole_gpus(count, False)] + ([_full_gpu_migs(count, full, False)] if full else [])
    if not several or nvlink == "none" or not has_nvlink:
        return tuple(plain)
    linked = [_whole_gpus(count, True)] + ([_full_gpu_migs(count, full, True)] if full else [])
    if nvlink == "strict":
        return tuple(linked)
    return tuple(alt for pair in zip(linked, plain, strict=True) for alt in pair)


def _whole_gpus(count: int, nvlink: bool) -> Alternative:
    return Alternative("gpu", count, None, None, nvlink, (), ())


def _full_gpu_migs(count: int, full: tuple[str, ...], nvlink: bool) -> Alternative:
    return Alternative("mig", count, None, None, nvlink, full, ())
