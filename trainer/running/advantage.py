"""The driver's advantage phase: token rewards (the scores, minus β·KL when the KL is in the reward), then the
configured estimator's advantages and returns, written into the batch."""

from __future__ import annotations

from typing import Any

import torch

import algos
from planner.plan import StepPlan
from single_controller.data_proto import DataProto


def compute_advantage(
    batch: DataProto, algo: Any, plan: StepPlan, kl_ctrl: Any, metrics: dict, reward_extras: dict[str, list]
) -> None:
    """Write ``token_level_rewards``, ``advantages`` and ``returns`` (B, R) into ``batch`` for the ``algorithm``
    config ``algo``; ``kl_ctrl`` is the in-reward KL's coefficient controller, ``metrics`` receives the KL's.

    ``reward_extras`` are the reward function's per-row extra values (GDPO's reward components)."""
    tensors = batch.batch
    mask = tensors["response_mask"]
    if plan.compute_ref_log_prob and "old_log_probs" in tensors:
        kl = algos.kl_penalty(tensors["old_log_probs"], tensors["ref_log_prob"], algo.kl_penalty)
        metrics["actor/ref_kl"] = algos.masked_mean(kl, mask).item()
    if algo.use_kl_in_reward:
        tensors["token_level_rewards"], kl_metrics = algos.apply_kl_penalty(
            tensors["token_level_scores"],
            tensors["old_log_probs"],
            tensors["ref_log_prob"],
            mask,
            kl_ctrl,
            algo.kl_penalty,
        )
        metrics.update(kl_metrics)
    else:
        tensors["token_level_rewards"] = tensors["token_level_scores"]
    tensors["advantages"], tensors["returns"] = algos.compute_advantage(
        algo.adv_estimator,
        token_level_rewards=tensors["token_level_rewards"],
        response_mask=mask,
        config=algo,
        values=tensors.get("values"),
        index=batch.non_tensor_batch["uid"],
        reward_baselines=tensors.get("reward_baselines"),
        old_log_probs=tensors.get("old_log_probs"),
        sum_pi_squared=tensors.get("sum_pi_squared"),
        reward_components=_reward_components(reward_extras, algo.gdpo_reward_keys),
    )


def _reward_components(reward_extras: dict[str, list], keys: list[str] | None) -> list[torch.Tensor] | None:
    """The (B,) reward components ``algorithm.gdpo_reward_keys`` names, from the reward function's extra values."""
    if not keys:
        return None
    missing = [key for key in keys if key not in reward_extras]
    if missing:
        raise ValueError(
            f"algorithm.gdpo_reward_keys={keys}: compute_score returned no {missing} (its dict has "
            f"{sorted(reward_extras)})"
        )
    return [torch.tensor(reward_extras[key], dtype=torch.float32) for key in keys]
