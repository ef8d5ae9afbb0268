"""A config loaded and planned: ``config.load.compose_config``, then the step plan that checks what spans components.

The batch arithmetic (mini-batches that divide the batch, per-worker splits), the trainer mode's rules and the
phases' inputs are checked by computing the plan, so a config that loads here is one a run can start from.
"""

from __future__ import annotations

from collections.abc import Sequence

from config.adapter import Adapter
from config.load import compose_config
from config.schema import PPOConfig
from planner.plan import StepPlan, make_plan, num_workers


def load_with_plan(
    overrides: Sequence[str] = (), config_name: str | None = None, adapter: Adapter | None = None
) -> tuple[PPOConfig, StepPlan]:
    """``compose_config``'s config and the step plan that checked it (composed and computed once, then passed on)."""
    cfg = compose_config(overrides, config_name, adapter)
    return cfg, make_plan(cfg, num_workers(cfg))


def load_config(
    overrides: Sequence[str] = (), config_name: str | None = None, adapter: Adapter | None = None
) -> PPOConfig:
    """The typed config of ``conf/<config_name>.yaml`` (default: ``config.load.preset_for(overrides)``) with
    Hydra-style ``overrides`` (``["data.train_batch_size=8"]``; another dialect's keys through ``adapter``), checked,
    including the batch arithmetic for its ``trainer.n_gpus_per_node × trainer.nnodes`` workers."""
    return load_with_plan(overrides, config_name, adapter)[0]
