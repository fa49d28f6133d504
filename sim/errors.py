"""Errors of the simulator.

SimError
 +-- ScenarioError      a scenario file or generator description is wrong (exit code 2)
 +-- UnknownNameError   an unknown scenario or strategy was asked for (exit code 2)
 +-- AllocationError    the allocator model hit something the scheduler reports as an error
                        (a CEL runtime error, an unknown DeviceClass): the pod stays pending
"""

from __future__ import annotations

from gpu_slicer.core.errors import GpuSlicerError


class SimError(GpuSlicerError):
    """Base of every simulator error."""


class ScenarioError(SimError):
    """The scenario is malformed; the message names the key and what is valid."""


class UnknownNameError(SimError):
    """A scenario or strategy name that does not exist; the message lists the valid ones."""


class AllocationError(SimError):
    """The scheduler would report this claim as unallocatable with an error, not just 'no fit'."""
