"""MIG mode per GPU, and switching it on demand on GPUs that can (Hopper and newer).

Modes (DESIGN: "Per-GPU mode"):

* ``dynamic``: the GPU is advertised whole *and* as every MIG slice. MIG is enabled when the first
  slice is prepared on a GPU that is in full mode, and disabled when a whole GPU is prepared and
  no instance exists. Hopper and newer switch without a reset, so this costs no reboot.
* ``mig``: slices only (the Ampere default: a switch needs a GPU reset there).
* ``full``: no MIG; only the whole GPU.

A switch needs an idle GPU: clients such as DCGM, persistenced or nvidia_drm can block it. The
backend then raises GpuInUse, and :class:`MigModeBlocked` carries an actionable message that ends
up as the claim's error (the kubelet retries) and in the ``mig_mode_blocked_total`` metric.

A switch that needs a GPU reset (ResetRequired: Ampere, or any GPU in a cloud VM that cannot
reset it) never leaves the GPU half-way: the pending change is taken back, so no later reset or
reboot flips the GPU under running pods, and the GPU's mode becomes the one it is in (``full``
when MIG stays off, ``mig`` when it stays on), so the agent stops offering what it cannot make.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpu_slicer.core.devices import Mode
from gpu_slicer.slicer.backend import GpuBackend, GpuInfo
from gpu_slicer.slicer.errors import BackendError, GpuInUse, ResetRequired, SlicerError

GpuMode = Mode

log = logging.getLogger(__name__)


class MigModeBlocked(SlicerError):
    """The GPU's MIG mode does not fit the device and cannot be switched right now."""


class MigModeManager:
    """Makes a GPU's MIG mode fit the device about to be prepared on it.

    Callers hold the GPU's lock, so nothing else creates instances on it meanwhile.
    """

    def __init__(
        self,
        backend: GpuBackend,
        modes: dict[int, GpuMode],
        *,
        on_blocked: Callable[[int, str], None] | None = None,
        on_switched: Callable[[int, bool], None] | None = None,
    ) -> None:
        self._backend = backend
        self.modes = dict(modes)
        self._on_blocked = on_blocked
        self._on_switched = on_switched

    def mode(self, gpu_index: int) -> GpuMode:
        return self.modes.get(gpu_index, "mig")

    def ensure_for_slice(self, info: GpuInfo) -> None:
        """MIG must be on to create a slice; switch it on in dynamic mode."""
        if info.mig_enabled:
            return
        mode = self.mode(info.index)
        if mode != "dynamic":
            raise MigModeBlocked(
                f"GPU {info.index} is in full mode (MIG disabled) and its mode is {mode!r}: "
                "it cannot host MIG slices; enable MIG on it or run it in dynamic mode"
            )
        self._switch(info.index, True)

    def ensure_for_whole(self, info: GpuInfo) -> None:
        """A whole GPU needs MIG off; switch it off in dynamic mode when no instance exists."""
        if not info.mig_enabled:
            return
        mode = self.mode(info.index)
        if mode != "dynamic":
            raise MigModeBlocked(
                f"GPU {info.index} is in MIG mode and its mode is {mode!r}: it is not offered "
                "as a whole GPU; request a MIG slice or switch the GPU to dynamic mode"
            )
        existing = self._backend.instances(info.index)
        if existing:
            where = ", ".join(f"{i.profile}@{i.start}" for i in existing)
            raise MigModeBlocked(
                f"GPU {info.index} cannot be handed out whole: MIG instances exist ({where}); "
                "they must be destroyed first"
            )
        self._switch(info.index, False)

    def _switch(self, gpu_index: int, enabled: bool) -> None:
        verb = "enable" if enabled else "disable"
        try:
            self._backend.set_mig_mode(gpu_index, enabled)
        except GpuInUse as exc:
            message = (
                f"cannot {verb} MIG on GPU {gpu_index}: {exc}. Other clients (DCGM, "
                "nvidia-persistenced, nvidia_drm) block the switch; the kubelet will retry"
            )
            log.warning("MIG mode switch blocked", extra={"gpu": gpu_index, "error": str(exc)})
            if self._on_blocked is not None:
                self._on_blocked(gpu_index, message)
            raise MigModeBlocked(message) from exc
        except ResetRequired as exc:
            message = self._stay_as_is(gpu_index, enabled, exc)
            if self._on_blocked is not None:
                self._on_blocked(gpu_index, message)
            raise MigModeBlocked(message) from exc
        except BackendError:
            raise
        log.info("MIG mode switched", extra={"gpu": gpu_index, "enabled": enabled})
        if self._on_switched is not None:
            self._on_switched(gpu_index, enabled)

    def _stay_as_is(self, gpu_index: int, enabled: bool, exc: ResetRequired) -> str:
        """Take the pending change back and keep the GPU in the mode it is in; the message."""
        verb = "enable" if enabled else "disable"
        kept: GpuMode = "full" if enabled else "mig"
        try:
            self._backend.set_mig_mode(gpu_index, not enabled)
            withdrawn = "the pending change was taken back"
        except BackendError as undo:
            withdrawn = (
                f"taking the pending change back failed too ({undo}); it applies at the next "
                "GPU reset or reboot"
            )
        self.modes[gpu_index] = kept
        log.warning(
            "MIG mode change needs a GPU reset; GPU kept as it is",
            extra={"gpu": gpu_index, "mode": kept, "error": str(exc)},
        )
        offered = "whole only" if enabled else "as MIG slices only"
        return (
            f"cannot {verb} MIG on GPU {gpu_index}: the change needs a GPU reset, which this "
            f"node cannot do (common on cloud VMs with the GPU passed through): {exc}. The GPU "
            f"keeps its current mode and is offered {offered} from now on; {withdrawn}. To "
            f"change it, {verb} MIG mode by hand (nvidia-smi -i {gpu_index} -mig "
            f"{int(enabled)}), reset the GPU or reboot the node, then restart the agent"
        )
