"""ColoRL's configuration: the typed schema, loading it from Hydra, and the step plan derived from it.

Below the workers and the driver, which both import it: ``config.schema``/``config.sections`` (the frozen
dataclasses, home of every default), ``config.load`` (compose, build, check), ``config.plan`` (what a step runs).
Comments that name ``cli.inert`` or ``cli.normalize`` mean the door's command-line adapter (``config.adapter``).
"""

from config.checks import ConfigError
from config.load import load_config, load_with_plan, replace_keys, resolve_device, split_command_line, to_config
from config.plan import StepPlan, make_plan, num_workers, uses_critic
from config.schema import PPOConfig

__all__ = [
    "ConfigError",
    "PPOConfig",
    "StepPlan",
    "load_config",
    "load_with_plan",
    "make_plan",
    "num_workers",
    "replace_keys",
    "resolve_device",
    "split_command_line",
    "to_config",
    "uses_critic",
]
