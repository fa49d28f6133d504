"""What a MIG-capable GPU model is: its profiles, their engines and geometry, and how the
catalog's entries are built.

Each profile names the values that were not read off real ``nvidia-smi mig -lgip/-lgipp`` output
in ``unconfirmed`` (``confirmed`` is true when none is); a model is confirmed when all its profiles
are. Profile ids differ between devices: the NVML backend looks them up by the ``nvml_constant``;
``typical_id`` is informative only. The catalog's data (:mod:`core.catalog`) is built from
these types; the NVML backend builds them from what a GPU reports (:mod:`slicer.hardware`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from functools import cached_property

from gpu_slicer.core.errors import CatalogError

MIB = 1024 * 1024
GIB = 1024 * MIB


@dataclass(frozen=True)
class Engines:
    """Engine counts of a profile or a whole GPU, as ``nvidia-smi mig -lgip`` reports them."""

    copy: int
    decoders: int
    encoders: int
    jpeg: int
    ofa: int


@dataclass(frozen=True)
class Profile:
    """A GPU-instance profile of one model (for example ``1g.10gb`` on an H100 80GB)."""

    name: str
    nvml_constant: str
    ci_nvml_constant: str
    typical_id: int
    memory_slices: int
    compute_slices: int
    memory_bytes: int
    multiprocessors: int
    engines: Engines
    max_count: int
    starts: tuple[int, ...]
    unconfirmed: frozenset[str] = frozenset()
    """Values not read off hardware: any of ``VALUE_KINDS``."""

    @property
    def confirmed(self) -> bool:
        return not self.unconfirmed

    @property
    def media_exclusive(self) -> bool:
        """``+me`` (and ``+me.all``) profiles own the media engines: at most one per GPU."""
        return "+me" in self.name

    @property
    def size(self) -> int:
        return self.memory_slices

    def covers(self, start: int) -> range:
        """Memory slices that an instance of this profile at ``start`` occupies."""
        return range(start, start + self.memory_slices)


@dataclass(frozen=True)
class GpuModel:
    """A MIG-capable GPU model and every profile it offers."""

    key: str
    aliases: tuple[str, ...]
    product_names: tuple[str, ...]
    pci_device_ids: tuple[int, ...]
    architecture: str
    cuda_compute_capability: str
    memory_bytes: int
    memory_slices: int
    compute_slices: int
    multiprocessors: int
    engines: Engines
    profiles: tuple[Profile, ...]
    confirmed: bool
    source: str = "catalog"
    """``catalog`` (core.catalog's tables) or ``nvml`` (read off the GPU, slicer.hardware)."""

    def profile(self, name: str) -> Profile:
        found = self._by_name.get(name)
        if found is not None:
            return found
        known = ", ".join(p.name for p in self.profiles)
        raise CatalogError(f"{self.key} has no MIG profile {name!r}; it offers: {known}")

    def has_profile(self, name: str) -> bool:
        return name in self._by_name

    @cached_property
    def _by_name(self) -> dict[str, Profile]:
        """Profiles by name: the simulator looks profiles up millions of times per run."""
        return {p.name: p for p in self.profiles}

    @cached_property
    def _hash(self) -> int:
        return hash(tuple(getattr(self, f.name) for f in fields(self)))

    def __hash__(self) -> int:
        """The generated hash, computed once: models key caches on every lookup, and hashing
        every field (profiles, engines) each time cost the simulator about 4% of a run."""
        return self._hash

    @property
    def supports_dynamic_mig(self) -> bool:
        """Hopper and newer switch MIG mode without a GPU reset, so MIG can follow demand."""
        return self.architecture != "Ampere"


_GI = "NVML_GPU_INSTANCE_PROFILE_"
_CI = "NVML_COMPUTE_INSTANCE_PROFILE_"

VALUE_KINDS: frozenset[str] = frozenset({"memory", "multiprocessors", "engines", "placements"})
"""The kinds of profile value that ``Profile.unconfirmed`` can name."""


def mig_profile(
    name: str,
    constant: str,
    typical_id: int,
    *,
    size: int,
    compute: int,
    mib: int,
    sms: int,
    engines: Engines,
    max_count: int,
    starts: Sequence[int],
    unconfirmed: Iterable[str] = (),
) -> Profile:
    """A profile from the values ``nvidia-smi mig -lgip`` shows, with the NVML constants named
    the way the NVML backend looks them up."""
    return Profile(
        name=name,
        nvml_constant=_GI + constant,
        ci_nvml_constant=f"{_CI}{compute}_SLICE",
        typical_id=typical_id,
        memory_slices=size,
        compute_slices=compute,
        memory_bytes=mib * MIB,
        multiprocessors=sms,
        engines=engines,
        max_count=max_count,
        starts=tuple(starts),
        unconfirmed=frozenset(unconfirmed),
    )


# --- building the catalog's entries -----------------------------------------------------------


def _eight_slice_engines(media: str) -> dict[str, Engines]:
    """Engines per kind: ``ampere`` has no decoder on a plain 1g and one JPEG and OFA per GPU,
    ``hopper`` one decoder and JPEG per compute slice."""
    if media == "ampere":
        return {
            "1g": Engines(1, 0, 0, 0, 0),
            "1g+me": Engines(1, 1, 0, 1, 1),
            "1g2": Engines(1, 1, 0, 0, 0),
            "2g": Engines(2, 1, 0, 0, 0),
            "3g": Engines(3, 2, 0, 0, 0),
            "4g": Engines(4, 2, 0, 0, 0),
            "7g": Engines(7, 5, 0, 1, 1),
        }
    return {
        "1g": Engines(1, 1, 0, 1, 0),
        "1g+me": Engines(1, 1, 0, 1, 1),
        "1g2": Engines(1, 1, 0, 1, 0),
        "2g": Engines(2, 2, 0, 2, 0),
        "3g": Engines(3, 3, 0, 3, 0),
        "4g": Engines(4, 4, 0, 4, 0),
        "7g": Engines(8, 7, 0, 7, 1),
    }


_EIGHT_SLICE_GEOMETRY: tuple[tuple[str, str, int, int, int, int, Sequence[int]], ...] = (
    # kind, constant, typical id, size, compute, max, starts
    ("1g", "1_SLICE", 19, 1, 1, 7, range(7)),
    ("1g+me", "1_SLICE_REV1", 20, 1, 1, 1, range(7)),
    ("1g2", "1_SLICE_REV2", 15, 2, 1, 4, (0, 2, 4, 6)),
    ("2g", "2_SLICE", 14, 2, 2, 3, (0, 2, 4)),
    ("3g", "3_SLICE", 9, 4, 3, 2, (0, 4)),
    ("4g", "4_SLICE", 5, 4, 4, 1, (0,)),
    ("7g", "7_SLICE", 0, 8, 7, 1, (0,)),
)
"""The layout every 8-memory-slice, 7-compute-slice model shares, per profile kind."""


def _eight_slice_profiles(
    *,
    total_mib: int,
    names: dict[str, str],
    sms: dict[str, int],
    engines: dict[str, Engines],
    slice_mib: int,
    mib: dict[str, int] | None,
    confirmed: Sequence[str],
    confirmed_sms: Sequence[str],
) -> list[Profile]:
    """The profiles of the kinds a model offers (those in ``names``), in the shared layout's
    order: the order NVML lists them in and the catalog keeps."""
    profiles = []
    for kind, constant, typical_id, size, compute, max_count, starts in _EIGHT_SLICE_GEOMETRY:
        base_kind = "1g" if kind == "1g+me" else kind
        if base_kind not in names:
            continue
        name = names["1g"] + "+me" if kind == "1g+me" else names[kind]
        if mib is not None:
            size_mib = mib[base_kind]
        else:
            size_mib = total_mib if kind == "7g" else slice_mib * size
        unconfirmed = set(VALUE_KINDS) - set(confirmed)
        if base_kind not in confirmed_sms:
            unconfirmed.add("multiprocessors")
        profiles.append(
            mig_profile(
                name,
                constant,
                typical_id,
                size=size,
                compute=compute,
                mib=size_mib,
                sms=sms[base_kind],
                engines=engines[kind],
                max_count=max_count,
                starts=starts,
                unconfirmed=unconfirmed,
            )
        )
    return profiles


def eight_slice_model(
    key: str,
    *,
    aliases: Sequence[str] = (),
    product_names: Sequence[str],
    pci_ids: Sequence[int],
    architecture: str,
    cc: str,
    total_mib: int,
    names: dict[str, str],
    sms: dict[str, int],
    media: str,
    slice_mib: int = 0,
    mib: dict[str, int] | None = None,
    confirmed: Sequence[str] = (),
    confirmed_sms: Sequence[str] = (),
) -> GpuModel:
    """Build an 8-memory-slice, 7-compute-slice model (A100, H100, H200, GH200, B200, ...).

    ``names`` maps a kind (``1g``, ``1g2``, ``2g``, ``3g``, ``4g``, ``7g``) to its profile name,
    ``sms`` the same kinds to SM counts, and ``media`` selects the engine layout ("ampere": no
    decoder on a plain 1g, one JPEG and one OFA per GPU; "hopper": one decoder and JPEG per compute
    slice). Memory is ``mib`` per kind as ``nvidia-smi mig -lgip`` shows it where known, else
    ``slice_mib`` per memory slice (the 7g: ``total_mib``). ``confirmed`` lists the value kinds
    read off hardware for every profile; SM counts only for the kinds in ``confirmed_sms``.
    """
    eng = _eight_slice_engines(media)
    profiles = _eight_slice_profiles(
        total_mib=total_mib,
        names=names,
        sms=sms,
        engines=eng,
        slice_mib=slice_mib,
        mib=mib,
        confirmed=confirmed,
        confirmed_sms=confirmed_sms,
    )
    return GpuModel(
        key=key,
        aliases=tuple(aliases),
        product_names=tuple(product_names),
        pci_device_ids=tuple(pci_ids),
        architecture=architecture,
        cuda_compute_capability=cc,
        memory_bytes=total_mib * MIB,
        memory_slices=8,
        compute_slices=7,
        multiprocessors=sms["7g"],
        engines=eng["7g"],
        profiles=tuple(profiles),
        confirmed=all(p.confirmed for p in profiles),
    )


def whole_only_model(
    key: str,
    *,
    product_name: str = "",
    memory_bytes: int = 0,
    architecture: str = "",
    cuda_compute_capability: str = "",
) -> GpuModel:
    """A GPU model without MIG (an L4, an L40S; or one nothing is known of): it has no
    profile, so it is only ever offered whole."""
    return GpuModel(
        key=key,
        aliases=(),
        product_names=(product_name,) if product_name else (),
        pci_device_ids=(),
        architecture=architecture,
        cuda_compute_capability=cuda_compute_capability,
        memory_bytes=memory_bytes,
        memory_slices=0,
        compute_slices=0,
        multiprocessors=0,
        engines=Engines(0, 0, 0, 0, 0),
        profiles=(),
        confirmed=False,
    )
