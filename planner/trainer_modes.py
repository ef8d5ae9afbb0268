"""The trainer modes (``trainer.v1``), read with their defaults and checked before anything starts.

- ``sync``: each step generates its batch, then trains on it (ColoRL's loop).
- ``separate_async``: a rollout group of its own (``actor_rollout_ref.rollout.nnodes × n_gpus_per_node`` workers,
  beside the trainer's ``trainer.nnodes × n_gpus_per_node``) generates the next batches while the trainer's group
  trains on the current one; the weights go to it after every step.
- ``colocate_async``: generation on the one group, the workers running it and training in turn: partial rollouts
  (``trainer.asynchronous.partial``: a step's generation stops once a batch of groups has ended, the rest goes on at the
  next step); with a vLLM engine or a multi-turn agent loop, whole batches asked for before the update.

``num_warmup_batches`` of the mode is how many batches generation runs ahead of training (fractions round down to
whole batches); a batch's samples carry the version of the weights that generated them
(``trainer.asynchronous.replay_buffer``), and ``trainer.v1.sampler.max_off_policy_threshold`` /
``max_off_policy_strategy`` bound how old they may be.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

from config.checks import ConfigError, is_int, is_number

MODES = ("sync", "colocate_async", "separate_async")
STRATEGIES = ("drop", "wait")  # past the threshold: evict and refill a batch, or generate none that would get so old
V1 = "trainer.v1"


@dataclass(frozen=True)
class TrainerMode:
    """What ``trainer.v1`` asks for, checked. ``lookahead``: batches generated ahead of the one training (0 in
    ``sync``); ``rollout_workers``: the rollout group's workers (``separate_async`` only, else 0);
    ``max_off_policy_threshold``: null switches the version control off."""

    mode: str = "sync"
    lookahead: int = 0
    parameter_sync_step: int = 1
    max_off_policy_threshold: int | None = 8
    max_off_policy_strategy: str = "drop"
    rollout_workers: int = 0
    # colocate_async's partial rollouts (trainer.asynchronous.partial): the hf rollout, single-turn
    partial: bool = False

    @property
    def asynchronous(self) -> bool:
        return self.mode != "sync"

    @property
    def separate(self) -> bool:
        """The rollout runs on a worker group of its own."""
        return self.mode == "separate_async"


def trainer_mode(cfg: Any, trainer_workers: int) -> TrainerMode:
    """``cfg.trainer.v1`` (a ``PPOConfig``'s) as a ``TrainerMode``; ConfigError, one line, for an unknown mode or
    strategy, ``parameter_sync_step <= 0``, a rollout group that cannot be placed beside the trainer's
    ``trainer_workers``, or a look-ahead whose every batch the threshold would drop."""
    v1 = cfg.trainer.v1
    mode, sampler, separate = v1["trainer_mode"], v1["sampler"], v1["separate_async"]
    if mode not in MODES:
        raise ConfigError.invalid(f"{V1}.trainer_mode", mode, f"valid: {', '.join(MODES)}")
    strategy, threshold = sampler["max_off_policy_strategy"], sampler["max_off_policy_threshold"]
    if strategy not in STRATEGIES:
        raise ConfigError.invalid(f"{V1}.sampler.max_off_policy_strategy", strategy, f"valid: {', '.join(STRATEGIES)}")
    if threshold is not None and not (is_int(threshold) and threshold > 0):
        raise ConfigError.invalid(
            f"{V1}.sampler.max_off_policy_threshold", threshold, "must be a positive integer, or null (no bound)"
        )
    sync_step = separate["parameter_sync_step"]
    if not (is_int(sync_step) and sync_step > 0):
        raise ConfigError.invalid(
            f"{V1}.separate_async.parameter_sync_step", sync_step, "must be a positive integer (updates per sync)"
        )
    if mode == "sync":
        return TrainerMode(max_off_policy_threshold=threshold, max_off_policy_strategy=strategy)
    warmup = v1[mode]["num_warmup_batches"]
    if not (is_number(warmup) and warmup >= 0):
        raise ConfigError.invalid(f"{V1}.{mode}.num_warmup_batches", warmup, "must be a number >= 0")
    lookahead = math.floor(warmup)
    # a batch trains lookahead steps after the step that asked for it: its span is lookahead + 1
    if threshold is not None and lookahead + 1 > threshold and strategy == "drop":
        raise ConfigError(
            f"{V1}.{mode}.num_warmup_batches={warmup}: each batch would train {lookahead + 1} steps after it was asked "
            f"for, past {V1}.sampler.max_off_policy_threshold={threshold}, and be dropped; make it < {threshold}"
        )
    rollout_workers = _rollout_group(cfg, trainer_workers, sync_step) if mode == "separate_async" else 0
    if mode == "colocate_async" and not partial_rollouts(cfg):
        _warn_whole_batches(cfg)
    return TrainerMode(mode, lookahead, sync_step if mode == "separate_async" else 1, threshold, strategy,
                       rollout_workers, partial_rollouts(cfg))  # fmt: skip


def partial_rollouts(cfg: Any) -> bool:
    """Whether the rollout stops and goes on (``colocate_async``'s partial rollouts, ``trainer.asynchronous.partial``):
    the hf decode loop, single-turn. A vLLM engine or a multi-turn agent loop generates whole batches there."""
    rollout = cfg.actor_rollout_ref.rollout
    return cfg.trainer.v1["trainer_mode"] == "colocate_async" and rollout.name == "hf" and not rollout.multi_turn.enable


def _warn_whole_batches(cfg: Any) -> None:
    rollout = cfg.actor_rollout_ref.rollout
    what = "a multi-turn agent loop" if rollout.multi_turn.enable else f"actor_rollout_ref.rollout.name={rollout.name}"
    warnings.warn(
        f"{V1}.trainer_mode=colocate_async with {what}: no partial rollouts (only the hf single-turn rollout stops "
        "and goes on); generation runs whole batches ahead of training",
        stacklevel=4,
    )


def _rollout_group(cfg: Any, trainer_workers: int, sync_step: int) -> int:
    """The rollout group's workers, after checking that they exist, fit beside the trainer's and split the
    batch: a step is ``parameter_sync_step`` updates of ``ppo_mini_batch_size`` prompts."""
    rollout, data = cfg.actor_rollout_ref.rollout, cfg.data
    workers = rollout.nnodes * rollout.n_gpus_per_node
    prefix = "actor_rollout_ref.rollout"
    if workers <= 0:
        raise ConfigError(
            f"{prefix}.nnodes={rollout.nnodes} × n_gpus_per_node={rollout.n_gpus_per_node}: "
            f"{V1}.trainer_mode=separate_async runs the rollout on a group of its own; give it workers "
            f"(e.g. {prefix}.nnodes=1 {prefix}.n_gpus_per_node=1)"
        )
    num_cpus = cfg.ray_kwargs.ray_init.num_cpus
    if cfg.trainer.device == "cpu" and num_cpus is not None and num_cpus < trainer_workers + workers:
        raise ConfigError(
            f"ray_kwargs.ray_init.num_cpus={num_cpus}: cannot hold the trainer's {trainer_workers} and the rollout's "
            f"{workers} workers; set it to at least {trainer_workers + workers + 1} (or null)"
        )
    sequences = data.train_batch_size * rollout.n
    if sequences % workers:
        raise ConfigError(
            f"data.train_batch_size={data.train_batch_size} × {prefix}.n={rollout.n} = {sequences} sequences cannot "
            f"be split evenly across the rollout group's {workers} workers ({prefix}.nnodes × n_gpus_per_node)"
        )
    mini = cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    if data.train_batch_size != sync_step * mini:
        raise ConfigError(_sync_step_message(sync_step, mini, data.train_batch_size))
    return workers


def _sync_step_message(sync_step: int, mini: int, train_batch_size: int) -> str:
    """A step of separate_async is parameter_sync_step updates of one mini-batch each, so
    parameter_sync_step × ppo_mini_batch_size = train_batch_size; each of the three values that would make it hold."""
    sync_key, mini_key = f"{V1}.separate_async.parameter_sync_step", "actor_rollout_ref.actor.ppo_mini_batch_size"
    fixes = [
        *([f"{sync_key}={train_batch_size // mini}"] if train_batch_size % mini == 0 else []),
        *([f"{mini_key}={train_batch_size // sync_step}"] if train_batch_size % sync_step == 0 else []),
        f"data.train_batch_size={sync_step * mini}",
    ]
    return (
        f"{sync_key}={sync_step} × {mini_key}={mini} = {sync_step * mini} prompts, but data.train_batch_size="
        f"{train_batch_size}: a step of separate_async is parameter_sync_step updates of one mini-batch each; "
        f"set {' or '.join(fixes)}"
    )
