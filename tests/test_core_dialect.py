"""The core's tests load with ColoRL's own keys only, although collecting the door's tests imports the door.

Importing ``verl_compat.cli`` installs verl's adapter (``config.adapter.install``) as a side effect; this module
imports it at collection, as a whole session does, and ``tests/conftest.py``'s ``dialect`` fixture must still give
its tests the core's adapter: a door-only key is an unknown key here."""

import pytest

import verl_compat.cli  # noqa: F401  installs verl's adapter at collection, as collecting tests/verl_compat does
from config import ConfigError, adapter
from planner import load_config


def test_a_core_test_loads_with_the_cores_adapter_and_refuses_a_door_only_key():
    assert type(adapter.installed()) is adapter.Adapter
    with pytest.raises(ConfigError, match=r"^unknown config key 'custom_reward_function'"):
        load_config(["custom_reward_function.name=f"])  # verl's older place of reward.custom_reward_function
