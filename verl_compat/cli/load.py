"""verl's command lines into ColoRL's typed config: the adapter the core's loader asks (``config.adapter``).

``VerlAdapter`` answers with verl's rules: older key paths moved (``normalize.rewrite_aliases``), the composed tree
normalized as verl does at start-up (``normalize.normalize``), values ColoRL cannot honour refused or warned about
(``inert``), a checkpoint's older keys found at their current place (``normalize.current_place``). The loading
functions here are ``config.load``'s and ``planner.load``'s with this adapter passed: ``python main.py`` and the
benchmarks load through them, once, at load.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import DictConfig

import planner
from config import adapter as core_adapter
from config import load as core
from config.schema import PPOConfig
from planner import StepPlan
from verl_compat.cli.inert import check_refused, inert_warnings
from verl_compat.cli.normalize import current_place, normalize, rewrite_aliases


class VerlAdapter(core_adapter.Adapter):
    """verl 0.9.1's keys: its older spellings, its start-up derivations, and the keys of machinery ColoRL lacks."""

    def overrides(self, overrides: Sequence[str]) -> list[str]:
        return rewrite_aliases(overrides)

    def tree(self, written: dict) -> dict:
        return normalize(written)

    def check(self, cfg: Any) -> None:
        check_refused(cfg)

    def warnings(self, cfg: Any) -> list[str]:
        return inert_warnings(cfg)

    def current_place(self, key: str) -> str:
        return current_place(key)


VERL = VerlAdapter()
core_adapter.install(VERL)  # the trainer's warnings and resuming use it too (they never import this package)
core.store_schema(VERL)  # a preset composed by name (Hydra's application, the run report's) gets its keys too


def split_command_line(args: Sequence[str]) -> tuple[str, list[str], bool]:
    """``config.load.split_command_line`` with verl's key paths moved."""
    return core.split_command_line(args, VERL)


def load_config(overrides: Sequence[str] = (), config_name: str | None = None) -> PPOConfig:
    """``planner.load_config`` of a verl command line."""
    return planner.load_config(overrides, config_name, VERL)


def load_with_plan(overrides: Sequence[str] = (), config_name: str | None = None) -> tuple[PPOConfig, StepPlan]:
    """``planner.load_with_plan`` of a verl command line."""
    return planner.load_with_plan(overrides, config_name, VERL)


def to_config(node: DictConfig | Mapping) -> PPOConfig:
    """``config.load.to_config`` of a composed verl tree."""
    return core.to_config(node, VERL)
