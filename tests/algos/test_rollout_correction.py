"""Bypass mode's rollout correction worked by hand: importance weights, rejection, and the two bypass losses."""

import math

import pytest
import torch

import algos as ca
from algos import rollout_correction as rc
from config.sections import ActorConfig, PolicyLossConfig, RolloutCorrectionConfig

torch.set_num_threads(1)
LOG_W = torch.log(torch.tensor([[0.5, 1.0, 3.0], [1.5, 1.2, 9.0]]))  # log π − log π_rollout
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def _close(actual, expected):
    torch.testing.assert_close(torch.as_tensor(actual).float(), torch.as_tensor(expected).float(), rtol=1e-5, atol=1e-6)


def test_token_weights_truncate_or_zero_outside_the_band():
    weights, metrics = rc.rollout_is_weights(LOG_W, MASK, "token", 2.0)
    _close(weights, [[0.5, 1.0, 2.0], [1.5, 1.2, 0.0]])  # TIS: min(w, 2); padding 0
    assert metrics["rollout_is_ratio_fraction_high"].item() == pytest.approx(1 / 5)
    assert metrics["rollout_is_max"].item() == pytest.approx(2.0)
    icepop, metrics = rc.rollout_is_weights(LOG_W, MASK, "token", "0.8_2.0")
    _close(icepop, [[0.0, 1.0, 0.0], [1.5, 1.2, 0.0]])  # IcePop: w outside [0.8, 2] -> 0
    assert metrics["rollout_is_oob_ratio"].item() == pytest.approx(2 / 5)


def test_sequence_weights_are_the_product_of_the_token_ratios():
    weights, metrics = rc.rollout_is_weights(LOG_W, MASK, "sequence", 2.0)
    _close(weights, [[1.5, 1.5, 1.5], [1.8, 1.8, 0.0]])  # 0.5·1·3 and 1.5·1.2 (the padding's 9 is not a token)
    assert metrics["rollout_is_max"].item() == pytest.approx(1.8)
    normalised, metrics = rc.rollout_is_weights(LOG_W, MASK, "sequence", 2.0, rollout_is_batch_normalize=True)
    _close(normalised, weights / 1.65)  # the sequences' mean weight (1.5 + 1.8) / 2
    assert metrics["rollout_is_batch_norm_factor"].item() == pytest.approx(1.65)


def test_rejection_by_token_and_by_sequence():
    # token_k1 keeps −log w within [log 0.5, log 2], i.e. w in [0.5, 2]: the tokens with w = 3 and 9 (padding) go
    mask, metrics = rc.rollout_rejection_mask(LOG_W, MASK, "token_k1", "0.5_2.0")
    _close(mask, [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    assert metrics["rollout_rs_masked_fraction"].item() == pytest.approx(1 / 5)
    assert metrics["rollout_rs_seq_masked_fraction"].item() == pytest.approx(1 / 2)
    # seq_mean_k3: mean_t(w − 1 − log w); row 0's is ≈ 0.35, row 1's ≈ 0.04: a bound of 0.1 drops row 0
    seq, _ = rc.rollout_rejection_mask(LOG_W, MASK, "seq_mean_k3", 0.1)
    _close(seq, [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    # several options must all pass
    both, metrics = rc.rollout_rejection_mask(LOG_W, MASK, "seq_max_k2,token_k1", "0.5,0.5_2.0")
    _close(both, [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])  # row 0's max ½(log 3)² ≈ 0.60 > 0.5: all of row 0 goes
    assert {"rollout_rs_seq_max_k2_mean", "rollout_rs_token_k1_seq_masked_fraction"} <= set(metrics)


@pytest.mark.parametrize(("spec", "match"), [("0.5_x", "lower_upper"), ("3_2", "lower <= upper"), (True, "number")])
def test_bad_is_threshold(spec, match):
    with pytest.raises(ValueError, match=match):
        rc.parse_is_threshold(spec)


def test_bad_rejection_options():
    with pytest.raises(ValueError, match="seq_sum_k1"):
        rc.rollout_rejection_mask(LOG_W, MASK, "token_k4", 1.0)
    with pytest.raises(ValueError, match="one upper bound"):
        rc.rollout_rejection_mask(LOG_W, MASK, "token_k2", "0.5_2")
    with pytest.raises(ValueError, match="one per rollout_rs option"):
        rc.rollout_rejection_mask(LOG_W, MASK, "token_k2,token_k3", "1,2,3")


def _bypass_config(**corr) -> ActorConfig:
    return ActorConfig(
        policy_loss=PolicyLossConfig(loss_mode="bypass_mode", rollout_correction=RolloutCorrectionConfig(**corr))
    )


def test_bypass_ppo_clip_is_ppo_against_the_rollout_policy():
    rollout = torch.log(torch.tensor([[0.4, 0.5, 0.2], [0.3, 0.6, 0.5]]))
    logp = (rollout + LOG_W.clamp(max=0.5)).requires_grad_()
    adv = torch.tensor([[1.0, -1.0, 1.0], [-1.0, 1.0, 1.0]])
    loss, metrics = ca.compute_policy_loss(
        "bypass_mode", torch.zeros_like(rollout), logp, adv, MASK, config=_bypass_config(), rollout_log_probs=rollout
    )
    want, want_metrics = ca.compute_policy_loss("vanilla", rollout, logp, adv, MASK)
    _close(loss.detach(), want.detach())
    assert {k: v.item() for k, v in want_metrics.items()} == {k: metrics[k].item() for k in want_metrics}
    assert metrics["rollout_corr/kl"].item() == pytest.approx(ca.masked_mean(rollout - logp, MASK).item())
    assert metrics["rollout_corr/chi2_token"].item() > 0


def test_bypass_reinforce_weights_the_policy_gradient_and_drops_rejected_tokens():
    # L = −A·log π·w with w = min(π/π_rollout, 2); token_k1 in [0.5, 2] drops the w = 3 token from the mean
    rollout = torch.zeros(2, 3)
    logp = LOG_W.clone().requires_grad_()
    config = _bypass_config(
        loss_type="reinforce", rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0"
    )
    loss, metrics = ca.compute_policy_loss(
        "bypass_mode", rollout, logp, torch.ones(2, 3), MASK, config=config, rollout_log_probs=rollout
    )
    kept = [(0, 0, 0.5), (0, 1, 1.0), (1, 0, 1.5), (1, 1, 1.2)]  # (row, col, w)
    assert loss.item() == pytest.approx(-sum(w * math.log(w) for _, _, w in kept) / 4, rel=1e-5)
    loss.backward()
    expected = torch.zeros(2, 3)
    for row, col, w in kept:
        expected[row, col] = -w / 4
    _close(logp.grad, expected)
    assert metrics["actor/ppo_kl"].item() == pytest.approx(-sum(math.log(w) for _, _, w in kept) / 4, rel=1e-5)
    assert "rollout_corr/rollout_is_eff_sample_size" in metrics
