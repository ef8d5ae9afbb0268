"""One PPO step for every estimator and every policy loss on a tiny batch, without Ray: the command line loads
and plans, the phases the plan asks for produce their data, the driver computes the advantages, and the actor
makes one update on a tiny plain model; every metric is finite and the weights move.

(``benchmarks/algorithms.py`` runs the same through ``main.py`` on the toy task, one Ray start per name.)
"""

import copy
import math
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import algos
from config import ConfigError, replace_keys
from planner import load_config, make_plan
from tests.workers.helpers import build_tiny_checkpoint, make_update_batch
from trainer.running.advantage import compute_advantage
from workers.compute.actor import DataParallelPPOActor

PROMPTS, N, P, R = 2, 4, 4, 5
BASE = [
    f"data.train_batch_size={PROMPTS}",
    f"actor_rollout_ref.rollout.n={N}",
    "trainer.n_gpus_per_node=1",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS}",
    "actor_rollout_ref.actor.optim.lr=1e-2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "algorithm.gdpo_reward_keys=[format,accuracy]",
    "actor_rollout_ref.actor.policy_loss.dro_beta=0.1",
]
# verl's bypass mode with importance weights, rejection and the REINFORCE loss, on the rollout's log-probs (from
# the command line: policy_loss.rollout_correction is ${algorithm.rollout_correction}, resolved when loading)
BYPASS = [
    "actor_rollout_ref.rollout.calculate_log_probs=true",
    "algorithm.rollout_correction.bypass_mode=true",
    "algorithm.rollout_correction.rollout_is=token",
    "algorithm.rollout_correction.rollout_rs=token_k1",
    "algorithm.rollout_correction.rollout_rs_threshold=0.2_5.0",
    "algorithm.rollout_correction.loss_type=reinforce",
    "actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode",
]


@pytest.fixture(scope="module")
def tiny() -> SimpleNamespace:
    """The command line's config (loaded once; each case replaces its keys) and a tiny model to copy."""
    path = build_tiny_checkpoint(Path(tempfile.mkdtemp(prefix="colorl_one_step_")))
    return SimpleNamespace(config=load_config(BASE), model=AutoModelForCausalLM.from_pretrained(path))


def _step(tiny: SimpleNamespace, keys: dict[str, object]) -> dict[str, float]:
    torch.manual_seed(0)
    cfg = replace_keys(tiny.config, keys)
    plan = make_plan(cfg, 1)
    update_keys = plan.flows["step"].route("update_actor").reads
    model = copy.deepcopy(tiny.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.actor_rollout_ref.actor.optim.lr)
    actor = DataParallelPPOActor(model, optimizer, None, cfg.actor_rollout_ref.actor, plan.actor_mini_batch_size)
    batch, extras = _rollout(actor, plan, update_keys)
    metrics: dict[str, float] = {}
    compute_advantage(batch, cfg.algorithm, plan, None, metrics, extras)  # the driver's own phase, minus Ray
    update = actor.update_policy(batch.select(batch_keys=update_keys, non_tensor_batch_keys=[]))
    assert torch.isfinite(batch.batch["advantages"]).all()
    return {**metrics, **{k: float(np.mean(v)) for k, v in update.items()}}


def _rollout(actor: DataParallelPPOActor, plan, update_keys: tuple[str, ...]) -> tuple:
    """A rolled-out batch with what each phase the plan runs would have added (random where a model would)."""
    g = torch.Generator().manual_seed(1)
    batch = make_update_batch(PROMPTS * N, P, R)
    batch.pop(batch_keys=["old_log_probs", "ref_log_prob"])
    tensors, rows = batch.batch, PROMPTS * N
    batch.non_tensor_batch["uid"] = np.repeat([f"prompt{i}" for i in range(PROMPTS)], N).astype(object)
    lengths = tensors["response_mask"].sum(-1)
    scores = torch.zeros(rows, R)
    scores[torch.arange(rows), lengths - 1] = torch.rand(rows, generator=g)
    tensors["token_level_scores"] = scores
    extras = {"format": torch.rand(rows, generator=g).tolist(), "accuracy": scores.sum(-1).tolist()}
    if plan.compute_greedy_baseline:
        tensors["reward_baselines"] = torch.rand(rows, generator=g)
    if plan.recompute_old_log_prob:
        stats = actor.compute_token_stats(batch, 4, stats=("sum_pi_squared",) if plan.compute_sum_pi_squared else ())
        tensors["old_log_probs"] = stats["log_probs"] + 0.05 * torch.randn(rows, R, generator=g)
        if plan.compute_sum_pi_squared:
            tensors["sum_pi_squared"] = stats["sum_pi_squared"]
    if plan.use_critic:
        tensors["values"] = torch.randn(rows, R, generator=g)
    if "rollout_log_probs" in update_keys or plan.old_log_prob_from_rollout:  # a rollout a little off the policy
        tensors["rollout_log_probs"] = actor.compute_log_prob(batch, 4)[0] + 0.2 * torch.randn(rows, R, generator=g)
    if plan.old_log_prob_from_rollout:
        tensors["old_log_probs"] = tensors["rollout_log_probs"]
    return batch, extras


def _finite(metrics: dict[str, float]) -> None:
    assert metrics["actor/grad_norm"] > 0
    bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
    assert not bad, f"non-finite metrics {bad}"


@pytest.mark.parametrize("estimator", list(algos.ADV_ESTIMATORS))
def test_one_step_per_estimator(tiny, estimator):
    _finite(_step(tiny, {"algorithm.adv_estimator": estimator}))


@pytest.mark.parametrize("loss_mode", [mode for mode in algos.POLICY_LOSSES if mode != "bypass_mode"])
def test_one_step_per_policy_loss(tiny, loss_mode):
    metrics = _step(
        tiny,
        {
            "actor_rollout_ref.actor.policy_loss.loss_mode": loss_mode,
            "actor_rollout_ref.actor.skip_on_policy_old_log_prob": False,
        },
    )
    _finite(metrics)
    assert "actor/pg_loss" in metrics


def test_one_step_in_bypass_mode(tiny):
    with pytest.raises(ConfigError, match="calculate_log_probs"):  # without the rollout's log-probs: refused
        make_plan(replace_keys(tiny.config, {"actor_rollout_ref.actor.policy_loss.loss_mode": "bypass_mode"}), 1)
    metrics = _step(SimpleNamespace(config=load_config([*BASE, *BYPASS]), model=tiny.model), {})
    _finite(metrics)
    assert "rollout_corr/rollout_is_mean" in metrics


@pytest.mark.parametrize("mode", algos.LOSS_AGG_MODES)
def test_one_step_per_aggregation(tiny, mode):
    _finite(_step(tiny, {"actor_rollout_ref.actor.loss_agg_mode": mode}))
