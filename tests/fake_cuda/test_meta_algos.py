"""Every advantage estimator and policy loss of ``algos/`` on ``meta`` tensors: no CPU tensor mixed into device
arithmetic and no value read on the host, except the reads ``algos.host_sync.HOST_SYNCS`` lists."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import algos
from algos.distillation import DISTILLATION_LOSSES, distillation_token_losses
from config.sections import PolicyLossConfig, RolloutCorrectionConfig
from tests.workers.helpers import actor_config

pytestmark = pytest.mark.fake_cuda

B, R = 4, 5
META = torch.device("meta")


def _inputs() -> dict:
    return dict(
        token_level_rewards=torch.randn(B, R, device=META),
        response_mask=torch.ones(B, R, device=META),
        values=torch.randn(B, R, device=META),
        index=np.array(["a", "a", "b", "b"]),
        reward_baselines=torch.randn(B, device=META),
        old_log_probs=torch.randn(B, R, device=META),
        sum_pi_squared=torch.rand(B, R, device=META),
        reward_components=[torch.randn(B, device=META), torch.randn(B, device=META)],
    )


@pytest.mark.parametrize("name", list(algos.ADV_ESTIMATORS))
def test_estimator_on_meta(name):
    advantages, returns = algos.compute_advantage(name, **_inputs())
    assert advantages.device == META and advantages.shape == (B, R) and returns.shape == (B, R)


@pytest.mark.parametrize("name", sorted(set(algos.POLICY_LOSSES) - {"bypass_mode"}))
def test_policy_loss_on_meta(name):
    """kl_cov picks its penalised tokens on the CPU (verl's ties): a meta batch reads as no valid token
    (``policy_losses.kl_cov_count``), so its device arithmetic runs here and its CPU top-k does not."""
    log_prob = torch.randn(B, R, device=META, requires_grad=True)
    loss, metrics = algos.compute_policy_loss(
        name,
        old_log_prob=torch.randn(B, R, device=META),
        log_prob=log_prob,
        advantages=torch.randn(B, R, device=META),
        response_mask=torch.ones(B, R, device=META),
        rollout_log_probs=torch.randn(B, R, device=META),
        config=actor_config(policy_loss=PolicyLossConfig(loss_mode=name, dro_beta=0.1)),
    )
    loss.backward()
    assert loss.device == META and log_prob.grad.device == META
    assert all(v.device == META for v in metrics.values() if isinstance(v, torch.Tensor))


@pytest.mark.parametrize(
    "correction",
    [
        dict(),
        dict(loss_type="reinforce", rollout_is="token", rollout_is_batch_normalize=True),
        dict(rollout_is="sequence", rollout_rs="token_k1,seq_mean_k3", rollout_rs_threshold="0.5_2.0,2.0"),
    ],
    ids=["ppo_clip", "reinforce_token_is", "sequence_is_rejection"],
)
def test_bypass_mode_on_meta(correction):
    config = actor_config(
        policy_loss=PolicyLossConfig(
            loss_mode="bypass_mode", rollout_correction=RolloutCorrectionConfig(bypass_mode=True, **correction)
        )
    )
    log_prob = torch.randn(B, R, device=META, requires_grad=True)
    loss, metrics = algos.compute_policy_loss(
        "bypass_mode",
        old_log_prob=torch.randn(B, R, device=META),
        log_prob=log_prob,
        advantages=torch.randn(B, R, device=META),
        response_mask=torch.ones(B, R, device=META),
        rollout_log_probs=torch.randn(B, R, device=META),
        config=config,
    )
    loss.backward()
    assert loss.device == META and log_prob.grad.device == META


@pytest.mark.parametrize("mode", list(DISTILLATION_LOSSES))
def test_distillation_token_losses_on_meta(mode):
    student = torch.randn(B, R, device=META, requires_grad=True)
    student_topk = torch.randn(B, R, 3, device=META, requires_grad=True)
    losses, metrics = distillation_token_losses(
        mode,
        torch.ones(B, R, device=META),
        student_log_probs=student,
        teacher_log_probs=torch.randn(B, R, device=META),
        student_topk_log_probs=student_topk,
        teacher_topk_log_probs=torch.randn(B, R, 3, device=META),
        log_prob_min_clamp=-10.0,
    )
    losses.sum().backward()
    assert losses.device == META and losses.shape == (B, R)
