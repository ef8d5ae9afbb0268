"""The core loader speaks verl's dialect only through the adapter it is given (``config.adapter``): without it a
verl spelling, or a key of verl's that ColoRL does not read, is an unknown key; through ``verl_compat.cli`` both
behave as verl's command lines do."""

import pytest

from config import ConfigError
from config.adapter import Adapter, installed
from planner import load_config as core_load
from verl_compat import cli

OLD_SPELLING = "critic.fsdp_config.param_offload=true"  # verl's older place of critic.fsdp.param_offload
REFUSED = "actor_rollout_ref.rollout.ignore_eos=true"  # ignoring it would train something else


def test_the_core_loader_alone_knows_only_the_schemas_keys():
    with pytest.raises(ConfigError, match="unknown config key 'critic.fsdp_config'"):
        core_load([OLD_SPELLING], adapter=Adapter())
    with pytest.raises(ConfigError, match="unknown config key 'actor_rollout_ref.rollout.ignore_eos'"):
        core_load([REFUSED], adapter=Adapter())  # a key only verl has is the door's schema's (cli.schema)
    assert Adapter().warnings(core_load(["actor_rollout_ref.rollout.gpu_memory_utilization=0.9"])) == []


def test_the_door_moves_older_spellings_and_refuses_what_it_cannot_honour():
    assert cli.load_config([OLD_SPELLING]).critic.fsdp.param_offload is True
    with pytest.raises(ConfigError, match="ignore_eos=True: ColoRL's rollout ends a response at its EOS token"):
        cli.load_config([REFUSED])
    cfg = cli.load_config(["actor_rollout_ref.rollout.gpu_memory_utilization=0.9"])
    assert [w.split("=")[0] for w in cli.inert_warnings(cfg)] == ["actor_rollout_ref.rollout.gpu_memory_utilization"]
    assert installed() is cli.VERL  # importing the door installed it: the trainer's warnings and resuming use it
    assert cli.VERL.current_place("ray_init.num_cpus") == "ray_kwargs.ray_init.num_cpus"
