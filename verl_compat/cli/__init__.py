"""verl's command lines: what exists only so that they load (``verl_compat.cli``).

- ``load``: the adapter the core's loader asks (``config.adapter``) and the loading functions with it passed;
- ``normalize``: verl's older spellings and what verl derives from its keys as it starts;
- ``inert``: verl's keys of machinery ColoRL does not have, each warned about or refused in one line.

Importing this package installs the adapter (``config.adapter.install``): ``main.py`` imports it, and so may any
script that loads verl command lines through ``config``.
"""

from config import ConfigError
from planner import StepPlan, make_plan, num_workers
from verl_compat.cli.inert import INERT, VLLM_KEYS, check_refused, inert_warnings
from verl_compat.cli.load import VERL, VerlAdapter, load_config, load_with_plan, split_command_line, to_config

__all__ = [
    "INERT",
    "VERL",
    "VLLM_KEYS",
    "ConfigError",
    "StepPlan",
    "VerlAdapter",
    "check_refused",
    "inert_warnings",
    "load_config",
    "load_with_plan",
    "make_plan",
    "num_workers",
    "split_command_line",
    "to_config",
]
