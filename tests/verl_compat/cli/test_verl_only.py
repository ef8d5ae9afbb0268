"""verl's keys ColoRL does not read live in the door's schema only (``verl_compat.cli.schema``): the core loader
does not know them, the door's loads each with verl's default, and the door's config is the core's, section by
section, so the core reads it as its own (and it travels to the workers pickled)."""

import dataclasses
import pickle

import pytest

from config import ConfigError
from config.adapter import Adapter
from config.schema import PPOConfig
from config.tree import flat
from planner import load_config as core_load
from verl_compat import cli
from verl_compat.cli.schema import VERL_ONLY, VerlPPOConfig


def _paths(section: object, found: type, prefix: str = "") -> list[str]:
    """The dotted keys under which sections of type ``found`` (or a subclass) sit in the instance ``section``."""
    paths = [prefix.rstrip(".")] if isinstance(section, found) else []
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            paths += _paths(value, found, f"{prefix}{f.name}.")
        elif isinstance(value, dict):  # named entries of one kind (distillation.teacher_models.<name>)
            for name, entry in value.items():
                if dataclasses.is_dataclass(entry):
                    paths += _paths(entry, found, f"{prefix}{f.name}.{name}.")
    return paths


VERL_KEYS = [
    f"{path}.{spec[0]}".lstrip(".")
    for section, keys in VERL_ONLY.items()
    for path in _paths(PPOConfig(), section)
    for spec in keys.fields
    if spec[0] not in {f.name for f in dataclasses.fields(section)}  # not a core key whose subtree the door grows
]


def test_the_door_adds_every_listed_key_and_the_core_schema_has_none():
    assert len(VERL_KEYS) >= len(VERL_ONLY)
    core, door = dict(flat(PPOConfig())), dict(flat(VerlPPOConfig()))
    assert set(core) < set(door)
    for key in VERL_KEYS:
        assert not any(k == key or k.startswith(f"{key}.") for k in core), key
        assert any(k == key or k.startswith(f"{key}.") for k in door), key
    assert {k: door[k] for k in core} == core  # the core's keys keep their defaults (critic.optim.lr among them)
    grown = "trainer.v1.separate_async.hybrid_rollout.enable_switch"  # a core subtree with verl's keys added
    assert grown in door and grown not in core and "trainer.v1.separate_async.parameter_sync_step" in core


def _override(key: str) -> str:
    """``key`` (or its first leaf, for a subtree) set to its default, as a command line writes it."""
    value = dict(flat(VerlPPOConfig()))
    leaf = next(k for k in value if k == key or k.startswith(f"{key}."))
    return f"{leaf}={'null' if value[leaf] is None else value[leaf]}"


@pytest.mark.parametrize("section", list(VERL_ONLY), ids=lambda section: section.__name__)
def test_a_verl_only_key_is_unknown_to_the_core_loader(section):
    core = {f.name for f in dataclasses.fields(section)}
    name = next(spec[0] for spec in reversed(VERL_ONLY[section].fields) if spec[0] not in core)
    key = f"{_paths(PPOConfig(), section)[0]}.{name}".lstrip(".")
    with pytest.raises(ConfigError, match="unknown config key"):
        core_load([_override(key)], adapter=Adapter())


def test_every_verl_only_key_loads_through_the_door_at_its_default_without_a_warning():
    cfg = cli.load_config([_override(key) for key in VERL_KEYS])
    assert cli.inert_warnings(cfg) == []


def test_the_door_config_is_the_cores_section_by_section_and_pickles():
    cfg = cli.load_config(["actor_rollout_ref.model.path=/m", "actor_rollout_ref.actor.use_dynamic_bsz=true"])
    assert isinstance(cfg, PPOConfig)
    assert isinstance(cfg.actor_rollout_ref.actor, type(PPOConfig().actor_rollout_ref.actor))
    assert pickle.loads(pickle.dumps(cfg)) == cfg


def test_a_key_colorl_honours_does_not_warn_as_unused():
    """``entropy_coeff`` is the actor's entropy bonus, not one of verl's chunked-entropy switches (``entropy_*``)."""
    cfg = cli.load_config(
        ["actor_rollout_ref.model.path=/m", "actor_rollout_ref.actor.use_dynamic_bsz=true"]
        + ["actor_rollout_ref.actor.entropy_coeff=0.01", "actor_rollout_ref.actor.entropy_checkpointing=true"]
    )
    assert [w.split("=")[0] for w in cli.inert_warnings(cfg)] == ["actor_rollout_ref.actor.entropy_checkpointing"]
