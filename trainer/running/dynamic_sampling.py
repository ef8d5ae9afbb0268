"""DAPO's dynamic sampling on the driver: generate in batches until enough prompt groups carry signal.

A prompt group (one prompt's ``rollout.n`` responses, rows sharing a ``uid``) whose responses all get the same
``algorithm.filter_groups.metric`` gives a group-baseline estimator zero advantage: it trains nothing. With
``filter_groups.enable`` such groups are dropped, and generation batches of ``data.gen_batch_size`` prompts are
drawn, each through the phases up to the reward, until ``data.train_batch_size`` groups are left; the step then
trains on exactly that many (the first ones; the surplus is dropped), at most ``max_num_gen_batches`` batches a
step (0: no limit). Without filtering, generation batches of another size than the training batch are collected
the same way, every group kept.

The kept rows come from several generation batches, whose tensors the workers' step stores held under each
batch's own token: the step plan's ``filter_groups`` phase makes the generation phase give back every key a later
phase reads (``planner.phases.declare_flows``), and the training phases start a new token on the collected batch.

Metrics: ``train/num_gen_batches`` (the DAPO recipe's), ``training/filter_groups/evicted_samples``
(groups dropped for zero spread) and ``training/filter_groups/discarded_surplus_samples`` (groups with signal
beyond the batch; both counted in prompt groups); and
``training/filter_groups/frac_reward_zero_std``, the share of the *trained* groups whose rewards are all equal
(``health/frac_reward_zero_std`` is over every group generated in the step).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

import numpy as np

from config import ConfigError, PPOConfig
from config.schema import FILTER_TENSOR_METRICS
from planner import StepPlan
from single_controller.data_proto import DataProto
from trainer.observing.metrics import reward_group_metrics

Sampled = tuple[DataProto, dict[str, list], dict[str, float]]  # a generation batch, its reward extras, its metrics


class DynamicSamplingError(RuntimeError):
    """``max_num_gen_batches`` generation batches left fewer prompt groups with signal than a step trains on."""


def metric_values(batch: DataProto, metric: str, reward_extras: dict[str, list]) -> np.ndarray:
    """(B,) the filter's ``metric`` per response: the summed score for ``reward``/``seq_reward``/
    ``seq_final_reward`` (the plan refuses the last with the in-reward KL), else the reward function's value of
    that name (``acc`` is the score when the function returns a plain number, as the dapo manager records)."""
    if metric in FILTER_TENSOR_METRICS:
        return batch.batch["token_level_scores"].sum(-1).double().numpy()
    if metric not in reward_extras and metric == "acc":
        metric = "score"
    if metric not in reward_extras:
        raise ConfigError.invalid(
            "algorithm.filter_groups.metric",
            metric,
            f"the reward function returns no such value (it returns {sorted(reward_extras)}); name one of them "
            f"or one of {', '.join(FILTER_TENSOR_METRICS)}",
        )
    return np.asarray(reward_extras[metric], dtype=np.float64)


def groups_with_signal(uids: Sequence[Hashable], values: np.ndarray) -> np.ndarray:
    """(B,) bool: the rows of groups (rows sharing a uid) whose ``values`` are not all equal; a group of one row
    is kept (it has no spread to measure)."""
    groups: dict[Hashable, list[int]] = {}
    for row, uid in enumerate(uids):
        groups.setdefault(uid, []).append(row)
    keep = np.zeros(len(uids), dtype=bool)
    for rows in groups.values():
        keep[rows] = len(rows) == 1 or float(np.std(values[rows])) > 0
    return keep


def collect(
    first: DataProto,
    more: Iterator[DataProto] | None,
    sample: Callable[[DataProto], Sampled],
    train_batch_size: int,
    n: int,
    filter_groups: Any,
) -> tuple[DataProto, dict[str, list], dict[str, float]]:
    """Exactly ``train_batch_size`` prompt groups (``n`` rows each), from ``first`` and then batches of ``more``,
    each run through ``sample`` (the phases up to the reward) and filtered when ``filter_groups.enable``.

    Returns the collected batch, its rows' reward extras, and the step's sampling metrics (each generation
    batch's own metrics averaged over the batches)."""
    kept: list[Sampled] = []
    groups = dropped = batches = drawn = 0  # groups kept and dropped, generation batches and prompts drawn
    cap = filter_groups.max_num_gen_batches if filter_groups.enable else 0
    while groups < train_batch_size:
        if batches:
            if 0 < cap <= batches:
                raise DynamicSamplingError(_short_message(filter_groups, batches, drawn, groups, train_batch_size))
            limit = f" of at most {cap}" if cap > 0 else ""
            print(  # a step that keeps generating shows why
                f"[colorl] dynamic sampling: {groups} of {train_batch_size} prompt groups after {batches} generation "
                f"batch(es){limit}; drawing another",
                flush=True,
            )
            first = next(more, None) if more is not None else None
            if first is None:
                raise DynamicSamplingError(f"{groups} of {train_batch_size} prompt groups and no batch left to draw")
        batch, extras, metrics = sample(first)
        batches, drawn = batches + 1, drawn + len(batch) // n
        keep = np.ones(len(batch), dtype=bool)
        if filter_groups.enable:
            keep = groups_with_signal(batch.non_tensor_batch["uid"], metric_values(batch, filter_groups.metric, extras))
        rows = np.flatnonzero(keep)
        part = batch[rows]
        part.meta_info = {}  # the generation batch's step token: the collected batch gets its own
        kept.append((part, {k: [v[i] for i in rows] for k, v in extras.items()}, metrics))
        groups += len(rows) // n
        dropped += (len(batch) - len(rows)) // n
    batch = DataProto.concat([b for b, _, _ in kept])[: train_batch_size * n]
    keys = dict.fromkeys(k for _, e, _ in kept for k in e)  # a value some batch lacks is 0 there, as within one
    extras = {k: [v for p, e, _ in kept for v in e.get(k, [0.0] * len(p))][: len(batch)] for k in keys}
    metrics = _mean([m for _, _, m in kept])
    metrics["train/num_gen_batches"] = float(batches)
    if filter_groups.enable:
        metrics["training/filter_groups/evicted_samples"] = float(dropped)
        metrics["training/filter_groups/discarded_surplus_samples"] = float(groups - train_batch_size)
        trained = reward_group_metrics(batch.batch["token_level_scores"].sum(-1), batch.non_tensor_batch["uid"])
        metrics.update({k.replace("health/", "training/filter_groups/"): v for k, v in trained.items()})
    return batch, extras, metrics


def _mean(per_batch: list[dict[str, float]]) -> dict[str, float]:
    keys = dict.fromkeys(k for m in per_batch for k in m)
    return {k: float(np.mean([m[k] for m in per_batch if k in m])) for k in keys}


def _short_message(filter_groups: Any, batches: int, drawn: int, groups: int, train_batch_size: int) -> str:
    return (
        f"algorithm.filter_groups.max_num_gen_batches={filter_groups.max_num_gen_batches}: {batches} generation "
        f"batches ({drawn} prompts) left {groups} of the data.train_batch_size={train_batch_size} prompt groups "
        f"whose {filter_groups.metric!r} differs between responses, {train_batch_size - groups} short "
        f"({groups / max(drawn, 1):.0%} of groups had signal). Raise max_num_gen_batches (0: no limit) or "
        "data.gen_batch_size, lower data.train_batch_size, or use a task whose difficulty suits the model"
    )


def dynamic_sampling_lines(cfg: PPOConfig, plan: StepPlan) -> list[str]:
    """The arithmetic of dynamic sampling (``trainer.running.dynamic_sampling``): how many generation batches a step
    draws, what the cap allows, how the run's length is counted; nothing without it."""
    if not plan.dynamic_sampling:
        return []
    data, n, groups = cfg.data, cfg.actor_rollout_ref.rollout.n, cfg.algorithm.filter_groups
    gen, train = plan.gen_batch_size, data.train_batch_size
    least = math.ceil(train / gen)
    lines = [
        f"dynamic sampling: generation batches of data.gen_batch_size={gen} prompts × {n} = {gen * n} sequences "
        f"({gen * n // plan.n_workers} per worker), through generation and reward, until data.train_batch_size="
        f"{train} prompt groups are collected: {least} batch(es) a step at least"
    ]
    if groups.enable:
        cap = groups.max_num_gen_batches
        limit = (
            f"at most algorithm.filter_groups.max_num_gen_batches={cap} a step ({cap * gen} prompts): a step fails "
            f"when fewer than {train / (cap * gen):.0%} of its groups have signal"
            if cap > 0
            else "no limit on batches a step (max_num_gen_batches<=0)"
        )
        lines += [
            f"  groups whose {groups.metric!r} is the same for all {n} responses are dropped; {limit}",
            f"  a step trains on exactly {train} groups (the surplus is dropped); with a share s of groups with "
            f"signal it draws about {train}/({gen}·s) batches, e.g. {math.ceil(train / (gen * 0.5))} at s=50%",
        ]
    if cfg.trainer.total_training_steps is None:
        lines.append(
            f"  the run ends after {cfg.trainer.total_epochs} epoch(s) of data or the steps above, whichever "
            "comes first (a step draws several batches)"
        )
    lines.append("  the kept rows' tensors go to the driver and back: they come from several generation batches")
    return lines
