"""ColoRL's configuration: the typed schema and loading it from Hydra.

Below the step planner, the workers and the driver, which all import it: ``config.schema``/``config.sections``
(the frozen dataclasses, home of every default), ``config.load`` (compose, build, check each key). What a step runs,
and the checks that span components, are the step planner's (``planner``). A command-line dialect reaches the loader
through ``config.adapter``: its older spellings, its own keys (a schema of its own) and its warnings.
"""

from config.checks import ConfigError
from config.load import compose_config, replace_keys, resolve_device, split_command_line, to_config
from config.schema import PPOConfig

__all__ = [
    "ConfigError",
    "PPOConfig",
    "compose_config",
    "replace_keys",
    "resolve_device",
    "split_command_line",
    "to_config",
]
