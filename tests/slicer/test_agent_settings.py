"""``agent run``'s one configuration: its flags, environment and files become the agent's
``AgentConfig`` in one place, with the defaults written once (the configuration's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_slicer.slicer.agent import AgentConfig
from gpu_slicer.slicer.cdi import FALLBACK_EDITS
from gpu_slicer.slicer.errors import AgentSettingsError
from gpu_slicer.slicer.profile_filter import ProfileFilter
from gpu_slicer.slicer.settings import AgentSettings


def test_settings_left_unset_give_the_configurations_own_defaults() -> None:
    settings = AgentSettings.from_mapping({"node": "n1"}).check()
    assert settings.agent_config(FALLBACK_EDITS) == AgentConfig(node="n1")


def test_each_setting_reaches_the_configuration_under_its_name() -> None:
    given = {
        "node": "n1",
        "checkpoint_dir": "/var/lib/other",
        "metrics_bind": "",
        "reconcile_interval": "45",
        "republish_interval": "2.5",
        "device_order": "name",
        "advertised_profiles": "all",
        "profiles": "1g.10gb,3g.40gb",
        "always_advertise": "3g.40gb",
        "withdraw_after": "60",
        "attributes": "minimal",
    }
    config = AgentSettings.from_mapping(given).check().agent_config(FALLBACK_EDITS)
    assert config.checkpoint_dir == Path("/var/lib/other")
    assert config.metrics_bind == ""
    assert (config.reconcile_interval_s, config.republish_interval_s) == (45.0, 2.5)
    assert config.withdraw_after_s == 60.0
    assert (config.device_order, config.advertised_profiles, config.attributes) == (
        "name",
        "all",
        "minimal",
    )
    assert config.profiles == ProfileFilter.parse("1g.10gb,3g.40gb")
    assert config.always_advertise == ProfileFilter.parse("3g.40gb")


@pytest.mark.parametrize(
    ("given", "flag"),
    [
        ({"profiles": "1g.10gb,,("}, "--profiles"),
        ({"always_advertise": "+"}, "--always-advertise"),
        ({"static_layout": "/nonexistent/layout.yaml"}, "--static-layout"),
    ],
)
def test_a_file_or_list_that_cannot_be_used_is_named_by_its_flag(
    given: dict[str, str], flag: str
) -> None:
    settings = AgentSettings.from_mapping({"node": "n1", **given}).check()
    with pytest.raises(AgentSettingsError) as raised:
        settings.agent_config(FALLBACK_EDITS)
    assert raised.value.problems[0].startswith(f"{flag}: ")
