"""``agent run``'s settings: one dataclass from the environment and flags, as every long-running
command is configured (:mod:`kube.settings`).

A DaemonSet configures the agent without arguments: each flag's twin is ``GPU_SLICER_<FLAG>``
(``--node`` also reads the Downward API's ``NODE_NAME``, ``--kubeconfig`` also ``KUBECONFIG``);
an empty variable counts as unset. Values that come from the environment bypass argparse's
checks, so :meth:`AgentSettings.problems` checks every value again, naming the flag.

The device order was ``--policy`` / ``GPU_SLICER_POLICY``, a name ``webhook serve`` also reads,
as its policy file. The old flag still works, with a deprecation warning. The old variable is
read, with the warning, only when ``GPU_SLICER_DEVICE_ORDER`` is unset and its value is a device
order's name: in one environment shared by both commands it names the webhook's policy file,
which the agent leaves alone (it used to refuse to start on it).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from gpu_slicer.kube.names import subdomain_problem
from gpu_slicer.kube.settings import Settings, SettingsError, env_name
from gpu_slicer.slicer.agent import ADVERTISE_CHOICES, Advertise, AgentConfig
from gpu_slicer.slicer.cdi import CommonEdits
from gpu_slicer.slicer.demand import (
    ADVERTISED_PROFILES_CHOICES,
    AdvertisedProfiles,
)
from gpu_slicer.slicer.device_attributes import ATTRIBUTES_CHOICES, DeviceAttributes
from gpu_slicer.slicer.errors import AgentSettingsError
from gpu_slicer.slicer.layout import LayoutError, StaticLayout
from gpu_slicer.slicer.ordering import DEVICE_ORDERS
from gpu_slicer.slicer.profile_filter import ProfileFilter, ProfileFilterError

BACKENDS = ("nvml", "simulated")
KUBE_CHOICES = ("cluster", "memory")
MAX_SECONDS = 10_000_000.0
"""About 115 days; beyond it the threads' timers overflow."""
_SECONDS = {
    "reconcile_interval": False,
    "republish_interval": False,
    "reprobe_interval": True,
    "lock_wait": True,
    "withdraw_after": True,
}
"""The settings that are seconds, and whether 0 is allowed (it turns the thing off)."""
LEGACY_ORDER_ENV = "GPU_SLICER_POLICY"
"""The device order's old variable: ``webhook serve``'s policy file in the same environment."""


def node_name_problem(node: str) -> str | None:
    """Why ``--node`` is not a valid node name (which is also the agent's pool name)."""
    return subdomain_problem("--node", node, "node")


def float_or_text(value: str) -> float | str:
    """Parse a number, keeping bad text so that the check can name the flag (exit 2)."""
    try:
        return float(value)
    except ValueError:
        return value


_DEFAULTS = AgentConfig(node="")
"""The agent's defaults, written once (:class:`slicer.agent.AgentConfig`): a setting left
unset is the configuration's own default."""


@dataclass(frozen=True)
class AgentSettings(Settings):
    """Settings of ``gpu-slicer agent run``; field ``x_y`` is flag ``--x-y``, env
    ``GPU_SLICER_X_Y``. Seconds are kept as given when they are not numbers, to be named."""

    error: ClassVar[type[SettingsError]] = AgentSettingsError
    env_aliases: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "node": ("NODE_NAME",),
        "kubeconfig": ("KUBECONFIG",),
    }
    empty_env_is_unset: ClassVar[bool] = True

    node: str = ""
    """Empty: not given (the agent refuses to start without it)."""
    backend: str = "nvml"
    simulate_gpus: str = "H100-80GB:2"
    simulate_state: Path | None = None
    kubeconfig: str | None = None
    kube: str = "cluster"
    checkpoint_dir: Path = _DEFAULTS.checkpoint_dir
    cdi_dir: Path = _DEFAULTS.cdi_dir
    plugins_dir: Path = _DEFAULTS.plugins_dir
    registry_dir: Path = _DEFAULTS.registry_dir
    metrics_bind: str = _DEFAULTS.metrics_bind
    reconcile_interval: float | str = _DEFAULTS.reconcile_interval_s
    device_order: str = _DEFAULTS.device_order
    """How devices are listed in the pool (:mod:`slicer.ordering`); was ``--policy``."""
    republish_interval: float | str = _DEFAULTS.republish_interval_s
    reprobe_interval: float | str = _DEFAULTS.reprobe_interval_s
    toolkit_cdi_spec: Path | None = None
    nvidia_ctk: str | None = None
    static_layout: Path | None = None
    advertise: Advertise = _DEFAULTS.advertise
    profiles: str = ""
    """The MIG profiles the partitionable layout may ever advertise
    (:mod:`slicer.profile_filter`); empty: all."""
    advertised_profiles: AdvertisedProfiles = _DEFAULTS.advertised_profiles
    """``asked``: the profiles the cluster's claims and templates ask for (:mod:`slicer.demand`);
    ``all``: every profile, all the time."""
    always_advertise: str = ""
    """Profiles advertised whether or not anyone asks (same syntax as ``profiles``)."""
    withdraw_after: float | str = _DEFAULTS.withdraw_after_s
    """Seconds a profile nobody asks for any more stays advertised."""
    attributes: DeviceAttributes = _DEFAULTS.attributes
    """Which attributes and capacities each device carries (:mod:`slicer.device_attributes`)."""
    lock_wait: float | str = 0.0

    @classmethod
    def from_sources(
        cls, flags: Mapping[str, Any], environ: Mapping[str, str] | None = None
    ) -> tuple[AgentSettings, list[str]]:
        """Defaults, then the environment, then ``flags`` (keys: field names); also the
        deprecation warnings to give for the old ``--policy`` and ``GPU_SLICER_POLICY``."""
        env = os.environ if environ is None else environ
        warnings: list[str] = []
        base = cls.from_env(env)
        legacy = env.get(LEGACY_ORDER_ENV, "")
        if legacy in DEVICE_ORDERS and not env.get(env_name("device_order")):
            base = replace(base, device_order=legacy)
            warnings.append(
                f"{LEGACY_ORDER_ENV}={legacy} is deprecated for agent run (webhook serve reads "
                f"{LEGACY_ORDER_ENV} as its policy file): set {env_name('device_order')}"
            )
        given = {str(k).replace("-", "_"): v for k, v in flags.items()}
        old_flag = given.pop("policy", None)
        if old_flag is not None:
            warnings.append("--policy is deprecated for agent run: use --device-order")
            given.setdefault("device_order", old_flag)
        return cls.from_mapping(given, base=base, source="flags"), warnings

    @classmethod
    def convert(cls, name: str, type_name: str, raw: Any) -> Any:
        if name in _SECONDS:
            return raw if isinstance(raw, float) else float_or_text(str(raw))
        return super().convert(name, type_name, raw)

    def seconds(self, name: str) -> float:
        """A setting of :data:`_SECONDS` as a valid number; ValueError naming the flag."""
        value, zero = getattr(self, name), _SECONDS[name]
        if (
            not isinstance(value, float)
            or not math.isfinite(value)
            or value < 0
            or (not zero and value == 0)
            or value > MAX_SECONDS
        ):
            bound = (">= 0" if zero else "> 0") + f" and <= {MAX_SECONDS:,.0f}"
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} must be a number of seconds {bound}, not {value!r}")
        return value

    def problems(self) -> list[str]:
        """The first bad value, named by its flag (the agent stops at the first)."""
        if not self.node:
            return ["--node is required (or set GPU_SLICER_NODE / NODE_NAME)"]
        problem = node_name_problem(self.node) or self._choice_problem() or self._path_problem()
        if problem:
            return [problem]
        for name in _SECONDS:
            try:
                self.seconds(name)
            except ValueError as exc:
                return [str(exc)]
        return []

    def agent_config(self, cdi_common: CommonEdits) -> AgentConfig:
        """What the agent's parts are built from: these (checked) settings under the
        configuration's names, the static layout they name read and the profile lists parsed;
        ``cdi_common``: the toolkit's CDI edits, which the command finds. The one place where
        flags, environment and files become the agent's configuration; AgentSettingsError
        names the flag of a file or list that cannot be used."""
        try:
            layout = StaticLayout.load(self.static_layout) if self.static_layout else None
        except LayoutError as exc:
            raise AgentSettingsError([f"--static-layout: {exc}"]) from exc
        return AgentConfig(
            node=self.node,
            checkpoint_dir=self.checkpoint_dir,
            cdi_dir=self.cdi_dir,
            plugins_dir=self.plugins_dir,
            registry_dir=self.registry_dir,
            metrics_bind=self.metrics_bind,
            reconcile_interval_s=self.seconds("reconcile_interval"),
            device_order=self.device_order,
            republish_interval_s=self.seconds("republish_interval"),
            reprobe_interval_s=self.seconds("reprobe_interval"),
            cdi_common=cdi_common,
            static_layout=layout,
            advertise=self.advertise,
            profiles=_profile_list("--profiles", self.profiles),
            advertised_profiles=self.advertised_profiles,
            always_advertise=_profile_list("--always-advertise", self.always_advertise),
            withdraw_after_s=self.seconds("withdraw_after"),
            attributes=self.attributes,
        )

    def _choice_problem(self) -> str | None:
        for flag, value, choices in (
            ("--backend", self.backend, BACKENDS),
            ("--kube", self.kube, KUBE_CHOICES),
            ("--device-order", self.device_order, tuple(DEVICE_ORDERS)),
            ("--advertise", self.advertise, ADVERTISE_CHOICES),
            ("--advertised-profiles", self.advertised_profiles, ADVERTISED_PROFILES_CHOICES),
            ("--attributes", self.attributes, ATTRIBUTES_CHOICES),
        ):
            if value not in choices:
                return f"{flag} {value!r} is not one of {', '.join(choices)}"
        return None

    def _path_problem(self) -> str | None:
        for flag in ("--checkpoint-dir", "--cdi-dir", "--plugins-dir", "--registry-dir"):
            folder = getattr(self, flag[2:].replace("-", "_"))
            if folder.exists() and not folder.is_dir():
                return f"{flag} {folder} is a file, not a folder"
        if self.metrics_bind:
            host, sep, port = self.metrics_bind.rpartition(":")
            if not sep or not port.isdigit() or int(port) > 65535:
                return (
                    f"--metrics-bind {self.metrics_bind!r} is not host:port with a port "
                    "0-65535 (e.g. :9464)"
                )
        return None


def _profile_list(flag: str, text: str) -> ProfileFilter | None:
    try:
        return ProfileFilter.parse(text)
    except ProfileFilterError as exc:
        raise AgentSettingsError([f"{flag}: {exc}"]) from exc
