"""kube.device_cel, the scheduler's CEL environment, on ResourceSlice device entries."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from gpu_slicer.kube.device_cel import DeviceView, SelectorError, matches

DRIVER = "gpu-slicer.io"


def device(**capacity: str) -> dict[str, Any]:
    return {
        "name": "gpu-0-mig-1g10gb-0",
        "attributes": {
            "type": {"string": "mig"},
            "placementStart": {"int": 2},
            "driverVersion": {"version": "580.65.6"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:10"},
        },
        "capacity": {name: {"value": value} for name, value in capacity.items()},
    }


def test_a_raw_device_entry_puts_unqualified_names_in_its_drivers_domain() -> None:
    view = DeviceView(DRIVER, device(memory="9856Mi"))
    assert view.attributes[DRIVER]["type"] == "mig"
    assert view.attributes[DRIVER]["placementStart"] == 2
    assert view.attributes["resource.kubernetes.io"]["pcieRoot"] == "pci0000:10"
    assert view.capacity[DRIVER]["memory"] == 9856 * 2**20
    assert matches(f'device.attributes["{DRIVER}"].type == "mig"', view)
    assert matches('device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:10"', view)


def test_the_same_entry_under_another_driver_answers_in_that_drivers_domain() -> None:
    view = DeviceView("gpu.nvidia.com", device())
    assert matches('device.attributes["gpu.nvidia.com"].type == "mig"', view)
    assert not matches(f'"type" in device.attributes["{DRIVER}"]', view)


def test_an_unknown_domain_is_an_empty_map_and_an_unknown_attribute_an_error() -> None:
    view = DeviceView(DRIVER, device())
    assert not matches('"profile" in device.attributes["example.com"]', view)
    with pytest.raises(SelectorError, match="runtime error"):
        matches(f'device.attributes["{DRIVER}"].noSuchAttribute == "x"', view)


@pytest.mark.parametrize(
    ("capacity", "literal", "sign"),
    [
        ("14", "14", 0),
        ("14", "14.5", -1),
        ("14", "14001m", -1),
        ("14", "13999m", 1),
        ("1", "1500m", -1),
        ("1500m", "1", 1),
        ("1500m", "1.5", 0),
        ("500m", "0", 1),
        ("10Gi", "10240Mi", 0),
        ("10Gi", "10737418241", -1),
    ],
)
def test_quantities_compare_exactly_even_when_fractional(
    capacity: str, literal: str, sign: int
) -> None:
    view = DeviceView(DRIVER, device(cpu=capacity))
    ref = f'device.capacity["{DRIVER}"].cpu'
    assert matches(f'{ref}.compareTo(quantity("{literal}")) == {sign}', view)
    assert matches(f'{ref}.isGreaterThan(quantity("{literal}")) == {str(sign > 0).lower()}', view)
    assert matches(f'{ref}.isLessThan(quantity("{literal}")) == {str(sign < 0).lower()}', view)


def test_a_fractional_capacity_keeps_its_exact_value() -> None:
    view = DeviceView(DRIVER, device(cpu="1500m"))
    assert view.capacity[DRIVER]["cpu"] == Fraction(3, 2)


def test_equal_quantities_are_equal_and_unequal_ones_are_not() -> None:
    view = DeviceView(DRIVER, device())
    assert matches('quantity("1.5") == quantity("1500m")', view)
    assert not matches('quantity("1.5") == quantity("1")', view)
    assert matches('quantity("1Ki") == quantity("1024")', view)


def test_versions_compare_as_semantic_versions() -> None:
    view = DeviceView(DRIVER, device())
    ref = f'device.attributes["{DRIVER}"].driverVersion'
    assert matches(f'{ref}.isGreaterThan(semver("580.9.0"))', view)
    assert matches(f'{ref}.compareTo(semver("580.65.6")) == 0', view)
