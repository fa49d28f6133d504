"""The MIG catalog: which GPU models exist, which profiles they offer, and where those fit.

Pure data and pure functions: nothing here touches a GPU. The geometry model (see
docs/mig-geometry.md) is the one NVML enforces:

* a GPU instance occupies ``size`` consecutive *memory slices* starting at one of the profile's
  legal ``starts``; two instances never share a memory slice;
* a profile may appear at most ``max_count`` times;
* the compute slices of all instances stay within the GPU's compute slices;
* ``+me`` profiles take the media engines (OFA among them), so at most one exists per GPU.

Memory per profile differs between drivers by a fraction of a GiB, so on a real node the NVML
backend publishes what the GPU reports (:mod:`slicer.hardware`) and uses the catalog only to name
the model and to say where the two disagree. What a model and a profile are, and how the entries
below are built, is :mod:`core.gpu_model`; this module is the data, its lookups and the
placement rules over it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from gpu_slicer.core.errors import CatalogError
from gpu_slicer.core.gpu_model import (
    MIB,
    Engines,
    GpuModel,
    Profile,
    eight_slice_model,
    mig_profile,
)

# --- the data -------------------------------------------------------------------------------

_ALL_KINDS = ("1g", "1g2", "2g", "3g", "4g", "7g")

_A30 = GpuModel(
    key="A30-24GB",
    aliases=("A30",),
    product_names=("NVIDIA A30",),
    pci_device_ids=(0x20B7,),
    architecture="Ampere",
    cuda_compute_capability="8.0",
    memory_bytes=24576 * MIB,
    memory_slices=4,
    compute_slices=4,
    multiprocessors=56,
    engines=Engines(4, 4, 0, 1, 1),
    profiles=(
        mig_profile(
            "1g.6gb",
            "1_SLICE",
            14,
            size=1,
            compute=1,
            mib=5952,
            sms=14,
            engines=Engines(1, 0, 0, 0, 0),
            max_count=4,
            starts=range(4),
        ),
        mig_profile(
            "1g.6gb+me",
            "1_SLICE_REV1",
            21,
            size=1,
            compute=1,
            mib=5952,
            sms=14,
            engines=Engines(1, 1, 0, 1, 1),
            max_count=1,
            starts=range(4),
        ),
        mig_profile(
            "2g.12gb",
            "2_SLICE",
            5,
            size=2,
            compute=2,
            mib=11968,
            sms=28,
            engines=Engines(2, 2, 0, 0, 0),
            max_count=2,
            starts=(0, 2),
        ),
        mig_profile(
            "2g.12gb+me",
            "2_SLICE_REV1",
            6,
            size=2,
            compute=2,
            mib=11968,
            sms=28,
            engines=Engines(2, 2, 0, 1, 1),
            max_count=1,
            starts=(0, 2),
        ),
        mig_profile(
            "4g.24gb",
            "4_SLICE",
            0,
            size=4,
            compute=4,
            mib=24000,
            sms=56,
            engines=Engines(4, 4, 0, 1, 1),
            max_count=1,
            starts=(0,),
        ),
    ),
    confirmed=True,
)

_UNCONFIRMED = ("memory", "multiprocessors", "engines", "placements")

_RTX_PRO_6000 = GpuModel(
    key="RTX-PRO-6000-96GB",
    aliases=("RTX-PRO-6000",),
    product_names=(
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
    ),
    pci_device_ids=(0x2BB5,),
    architecture="Blackwell",
    cuda_compute_capability="12.0",
    memory_bytes=97887 * MIB,
    memory_slices=4,
    compute_slices=4,
    multiprocessors=188,
    engines=Engines(4, 4, 4, 4, 1),
    # The MIG user guide lists 1g.24gb (x4), 2g.48gb (x2) and 4g.96gb, with +me, +gfx, +me.all
    # and -me variants; the catalog keeps the plain ones and 1g.24gb+me, all unconfirmed. On a
    # node the NVML backend advertises every profile the GPU reports.
    profiles=(
        mig_profile(
            "1g.24gb",
            "1_SLICE",
            14,
            size=1,
            compute=1,
            mib=24064,
            sms=46,
            engines=Engines(1, 1, 1, 1, 0),
            max_count=4,
            starts=range(4),
            unconfirmed=_UNCONFIRMED,
        ),
        mig_profile(
            "1g.24gb+me",
            "1_SLICE_REV1",
            21,
            size=1,
            compute=1,
            mib=24064,
            sms=46,
            engines=Engines(1, 1, 1, 1, 1),
            max_count=1,
            starts=range(4),
            unconfirmed=_UNCONFIRMED,
        ),
        mig_profile(
            "2g.48gb",
            "2_SLICE",
            5,
            size=2,
            compute=2,
            mib=48128,
            sms=94,
            engines=Engines(2, 2, 2, 2, 0),
            max_count=2,
            starts=(0, 2),
            unconfirmed=_UNCONFIRMED,
        ),
        mig_profile(
            "4g.96gb",
            "4_SLICE",
            0,
            size=4,
            compute=4,
            mib=96256,
            sms=188,
            engines=Engines(4, 4, 4, 4, 1),
            max_count=1,
            starts=(0,),
            unconfirmed=_UNCONFIRMED,
        ),
    ),
    confirmed=False,
)

_HOPPER_SMS = {"1g": 16, "1g2": 26, "2g": 32, "3g": 60, "4g": 64, "7g": 132}
_AMPERE_SMS = {"1g": 14, "1g2": 14, "2g": 28, "3g": 42, "4g": 56, "7g": 98}
_HARDWARE = ("memory", "multiprocessors", "engines", "placements")
"""Every value kind of a profile read off ``nvidia-smi mig -lgip/-lgipp`` output."""
_GEOMETRY = ("placements",)
"""Only the placements (the shared 8-slice layout) are known; everything else is unconfirmed."""


def _names(n1: str, n1d: str, n2: str, n3: str, n4: str, n7: str) -> dict[str, str]:
    return {"1g": n1, "1g2": n1d, "2g": n2, "3g": n3, "4g": n4, "7g": n7}


MODELS: tuple[GpuModel, ...] = (
    eight_slice_model(
        "A100-40GB",
        aliases=("A100-SXM4-40GB",),
        product_names=("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),
        pci_ids=(0x20B0, 0x20F1),
        architecture="Ampere",
        cc="8.0",
        total_mib=40960,
        # The MIG user guide's `nvidia-smi mig -lgip`: 4.75, 9.62, 19.62 and 39.50 GiB (other
        # drivers show 19.50 and 39.25; NVML's figure is what the agent publishes).
        mib={"1g": 4864, "1g2": 9856, "2g": 9856, "3g": 20096, "4g": 20096, "7g": 40448},
        names=_names("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
        sms=_AMPERE_SMS,
        media="ampere",
        confirmed=_HARDWARE,
        confirmed_sms=_ALL_KINDS,
    ),
    eight_slice_model(
        "A100-80GB",
        product_names=("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
        pci_ids=(0x20B2, 0x20B5),
        architecture="Ampere",
        cc="8.0",
        total_mib=81920,
        # 9.50, 19.50, 39.25 GiB; the 7g.80gb shows 78.50-79.25 GiB depending on the driver:
        # the smallest figure, so that no memory-based chain promises more than a GPU has.
        mib={"1g": 9728, "1g2": 19968, "2g": 19968, "3g": 40192, "4g": 40192, "7g": 80384},
        names=_names("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        sms=_AMPERE_SMS,
        media="ampere",
        confirmed=_HARDWARE,
        confirmed_sms=_ALL_KINDS,
    ),
    _A30,
    eight_slice_model(
        "H100-80GB",
        product_names=("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"),
        pci_ids=(0x2330, 0x2331),
        architecture="Hopper",
        cc="9.0",
        total_mib=81559,
        # 9.75, 19.62, 39.50 and 79.25 GiB.
        mib={"1g": 9984, "1g2": 20096, "2g": 20096, "3g": 40448, "4g": 40448, "7g": 81152},
        names=_names("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        sms=_HOPPER_SMS,
        media="hopper",
        confirmed=_HARDWARE,
        confirmed_sms=_ALL_KINDS,
    ),
    eight_slice_model(
        "H800-80GB",
        aliases=("H800",),
        product_names=("NVIDIA H800", "NVIDIA H800 PCIe", "NVIDIA H800 80GB HBM3"),
        pci_ids=(),
        architecture="Hopper",
        cc="9.0",
        total_mib=81559,
        mib={"1g": 9984, "1g2": 20096, "2g": 20096, "3g": 40448, "4g": 40448, "7g": 81152},
        names=_names("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        sms=_HOPPER_SMS,
        media="hopper",
        confirmed=_GEOMETRY,
    ),
    eight_slice_model(
        "H100-NVL-94GB",
        aliases=("H100-NVL", "H100-94GB"),
        product_names=("NVIDIA H100 NVL",),
        pci_ids=(0x2321,),
        architecture="Hopper",
        cc="9.0",
        total_mib=95830,
        slice_mib=11776,
        names=_names("1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
        sms=_HOPPER_SMS,
        media="hopper",
        confirmed=("multiprocessors", "engines", "placements"),
        confirmed_sms=_ALL_KINDS,
    ),
    eight_slice_model(
        "H100-96GB",
        aliases=("GH200-96GB",),
        product_names=("NVIDIA H100 96GB HBM3", "NVIDIA GH200 96GB HBM3", "NVIDIA GH200 480GB"),
        pci_ids=(0x2342, 0x233D),
        architecture="Hopper",
        cc="9.0",
        total_mib=97871,
        slice_mib=12032,
        names=_names("1g.12gb", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"),
        sms=_HOPPER_SMS,
        media="hopper",
        confirmed=_GEOMETRY,
    ),
    eight_slice_model(
        "H20-96GB",
        aliases=("H20",),
        product_names=("NVIDIA H20",),
        pci_ids=(),
        architecture="Hopper",
        cc="9.0",
        total_mib=97871,
        slice_mib=12032,
        names=_names("1g.12gb", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"),
        # The H20 has 78 SMs in all; per profile a guess scaled from the H100 (unconfirmed).
        sms={"1g": 10, "1g2": 10, "2g": 20, "3g": 30, "4g": 40, "7g": 78},
        media="hopper",
        confirmed=_GEOMETRY,
    ),
    eight_slice_model(
        "H200-141GB",
        aliases=("H200", "H200-NVL-141GB", "H200-NVL"),
        product_names=("NVIDIA H200", "NVIDIA H200 NVL"),
        pci_ids=(0x2335, 0x233B),
        architecture="Hopper",
        cc="9.0",
        total_mib=143771,
        slice_mib=16640,
        names=_names("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
        sms=_HOPPER_SMS,
        media="hopper",
        confirmed=_GEOMETRY,
    ),
    eight_slice_model(
        "GH200-144GB",
        product_names=("NVIDIA GH200 144G HBM3e",),
        pci_ids=(0x2348,),
        architecture="Hopper",
        cc="9.0",
        total_mib=146944,
        slice_mib=16896,
        names=_names("1g.18gb", "1g.36gb", "2g.36gb", "3g.72gb", "4g.72gb", "7g.144gb"),
        sms=_HOPPER_SMS,
        media="hopper",
        confirmed=_GEOMETRY,
    ),
    eight_slice_model(
        "B200-180GB",
        aliases=("B200",),
        product_names=("NVIDIA B200",),
        pci_ids=(0x2901,),
        architecture="Blackwell",
        cc="10.0",
        total_mib=183359,
        slice_mib=22784,
        names=_names("1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"),
        sms={"1g": 18, "1g2": 18, "2g": 36, "3g": 54, "4g": 72, "7g": 144},
        media="hopper",
        confirmed=_GEOMETRY,
    ),
    eight_slice_model(
        "GB200-186GB",
        aliases=("GB200",),
        product_names=("NVIDIA GB200",),
        pci_ids=(0x2941,),
        architecture="Blackwell",
        cc="10.0",
        total_mib=189471,
        slice_mib=23552,
        names=_names("1g.23gb", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"),
        sms={"1g": 18, "1g2": 18, "2g": 36, "3g": 54, "4g": 72, "7g": 144},
        media="hopper",
        confirmed=_GEOMETRY,
    ),
    eight_slice_model(
        "B300-288GB",
        aliases=("B300",),
        product_names=("NVIDIA B300", "NVIDIA B300 SXM6 AC"),
        pci_ids=(0x3182,),
        architecture="Blackwell",
        cc="10.3",
        total_mib=275040,
        slice_mib=34304,
        names=_names("1g.34gb", "1g.67gb", "2g.67gb", "3g.135gb", "4g.135gb", "7g.269gb"),
        sms={"1g": 18, "1g2": 18, "2g": 36, "3g": 54, "4g": 72, "7g": 148},
        media="hopper",
        confirmed=_GEOMETRY,
    ),
    eight_slice_model(
        "GB300-288GB",
        aliases=("GB300",),
        product_names=("NVIDIA GB300",),
        pci_ids=(0x31C2,),
        architecture="Blackwell",
        cc="10.3",
        # NVIDIA's mig-parted names GB300's profiles 1g.35gb, 1g.70gb, 2g.70gb, 3g.139gb,
        # 4g.139gb and 7g.278gb, not B300's: its memory is inferred from those names (278 GiB,
        # an eighth per memory slice), not read off hardware, and stays unconfirmed.
        total_mib=278 * 1024,
        slice_mib=278 * 1024 // 8,
        names=_names("1g.35gb", "1g.70gb", "2g.70gb", "3g.139gb", "4g.139gb", "7g.278gb"),
        sms={"1g": 18, "1g2": 18, "2g": 36, "3g": 54, "4g": 72, "7g": 148},
        media="hopper",
        confirmed=_GEOMETRY,
    ),
    _RTX_PRO_6000,
)

NOT_PUBLISHED: dict[str, str] = {
    "H800-80GB": (
        "NVIDIA's tables group the H800 80GB with the H100 80GB without telling their PCI ids "
        "apart: its profiles are taken to be the H100 80GB's and it is recognised by name only"
    ),
    "H20-96GB": (
        "NVIDIA's tables group the H20 with the H100 96GB and GH200 without telling their PCI "
        "ids apart: its profiles are taken to be the H100 96GB's and it is recognised by name only"
    ),
    "RTX-PRO-6000-96GB 1g.24gb+me": (
        "NVIDIA's tables give this GPU 1g.24gb+me.all, 1g.24gb-me and 1g.24gb+gfx, not "
        "1g.24gb+me; the NVML backend advertises whichever variants the GPU reports"
    ),
}
"""What of the catalog NVIDIA's published MIG tables (the MIG user guide, mig-parted's default
configuration) do not confirm: a model key, or ``<model key> <profile>``, and why."""


_BY_KEY = {m.key.lower(): m for m in MODELS} | {a.lower(): m for m in MODELS for a in m.aliases}


def model_keys() -> list[str]:
    return [m.key for m in MODELS]


def get_model(key: str) -> GpuModel:
    """Look a model up by its key or an alias, case-insensitively."""
    try:
        return _BY_KEY[key.strip().lower()]
    except KeyError:
        raise CatalogError(
            f"unknown GPU model {key!r}; known models: {', '.join(model_keys())}"
        ) from None


def model_by_pci_device_id(device_id: int) -> GpuModel:
    """Look a model up by the PCI device id (the upper 16 bits of NVML's ``pciDeviceId``)."""
    if device_id > 0xFFFF:
        device_id >>= 16
    for model in MODELS:
        if device_id in model.pci_device_ids:
            return model
    raise CatalogError(f"no MIG-capable model with PCI device id {device_id:#06x}")


def model_by_product_name(product_name: str) -> GpuModel:
    """Look a model up by the name NVML reports (``NVIDIA H100 80GB HBM3``)."""
    wanted = " ".join(product_name.split()).lower()
    for model in MODELS:
        if wanted in (n.lower() for n in model.product_names):
            return model
    raise CatalogError(f"no MIG-capable model named {product_name!r}")


# --- geometry -------------------------------------------------------------------------------

Placement = tuple[str, int]
"""A (profile name, start) pair on one GPU."""


def placements(model: GpuModel, profile_name: str) -> list[tuple[int, int]]:
    """Legal ``(start, size)`` placements of a profile, as NVML lists them."""
    profile = model.profile(profile_name)
    return [(start, profile.memory_slices) for start in profile.starts]


def all_placements(model: GpuModel) -> list[Placement]:
    """Every legal (profile, start) of the model, in catalog order."""
    return [(p.name, s) for p in model.profiles for s in p.starts]


def violations(model: GpuModel, instances: Iterable[Placement]) -> list[str]:
    """Why a set of instances cannot coexist on one GPU of ``model``; empty when it can."""
    problems: list[str] = []
    occupied: dict[int, str] = {}
    counts: Counter[str] = Counter()
    compute = 0
    media = 0
    for name, start in instances:
        try:
            profile = model.profile(name)
        except CatalogError as exc:
            problems.append(str(exc))
            continue
        if start not in profile.starts:
            problems.append(
                f"{name} cannot start at memory slice {start} on {model.key}; "
                f"legal starts: {list(profile.starts)}"
            )
            continue
        for memory_slice in profile.covers(start):
            if memory_slice in occupied:
                other = occupied[memory_slice]
                problems.append(f"{name}@{start} overlaps {other} on memory slice {memory_slice}")
                break
            occupied[memory_slice] = f"{name}@{start}"
        counts[name] += 1
        compute += profile.compute_slices
        media += profile.media_exclusive
    for name, count in counts.items():
        profile = model.profile(name)
        if count > profile.max_count:
            problems.append(f"{count} x {name} exceeds its limit of {profile.max_count} per GPU")
    if compute > model.compute_slices:
        problems.append(
            f"{compute} compute slices exceed the {model.compute_slices} of {model.key}"
        )
    if media > 1:
        problems.append("more than one +me profile: media engines belong to one instance")
    return problems


class KnownViolations:
    """:func:`violations`, remembered per model and sequence of instances by whoever owns the
    object: a simulated cluster checks the same few thousand sets of instances tens of thousands
    of times. The answer, messages and their order included, is the function's."""

    def __init__(self) -> None:
        self._found: dict[tuple[GpuModel, tuple[Placement, ...]], list[str]] = {}

    def __call__(self, model: GpuModel, instances: Iterable[Placement]) -> list[str]:
        key = (model, tuple(instances))
        found = self._found.get(key)
        if found is None:
            found = self._found[key] = violations(model, key[1])
        return found


def is_valid(model: GpuModel, instances: Iterable[Placement]) -> bool:
    return not violations(model, instances)


def check_placement(model: GpuModel, profile_name: str, start: int) -> Profile:
    """Return the profile if ``start`` is one of its legal starts, else raise CatalogError."""
    profile = model.profile(profile_name)
    if start not in profile.starts:
        raise CatalogError(
            f"{profile_name} cannot start at memory slice {start} on {model.key}; "
            f"legal starts: {list(profile.starts)}"
        )
    return profile


def remaining_placements(model: GpuModel, present: Sequence[Placement]) -> list[Placement]:
    """Placements that could still be created next to the instances ``present``."""
    base = list(present)
    return [p for p in all_placements(model) if is_valid(model, [*base, p])]


def is_full_gpu_profile(model: GpuModel, profile: Profile) -> bool:
    """``profile`` occupies every memory and compute slice of ``model`` (no ``+me`` twin: it
    adds nothing a spanning instance lacks)."""
    return (
        profile.memory_slices == model.memory_slices
        and profile.compute_slices == model.compute_slices
        and not profile.media_exclusive
    )


def profiles_with_memory(
    min_bytes: int, models: Iterable[GpuModel] | None = None
) -> list[tuple[GpuModel, Profile]]:
    """Profiles with at least ``min_bytes`` of memory, smallest first (``+me`` variants left out).

    Ties are broken by fewer compute slices, then by model key, so the order is deterministic.
    """
    found = [
        (model, profile)
        for model in (MODELS if models is None else models)
        for profile in model.profiles
        if profile.memory_bytes >= min_bytes and not profile.media_exclusive
    ]
    found.sort(key=lambda mp: (mp[1].memory_bytes, mp[1].compute_slices, mp[0].key))
    return found


def all_profile_names() -> list[str]:
    """Every profile name of every model, without duplicates, in catalog order."""
    seen: dict[str, None] = {}
    for model in MODELS:
        for profile in model.profiles:
            seen.setdefault(profile.name, None)
    return list(seen)
