"""The estimators verl 0.9.1 added after GRPO, worked by hand, and the estimator registry."""

import math

import numpy as np
import pytest
import torch

import algos as ca
from algos.advantages import compute_optimal_token_baseline_advantage, compute_reinforce_plus_plus_outcome_advantage
from algos.group_estimators import (
    compute_gdpo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
)
from config.schema import AlgorithmConfig

torch.set_num_threads(1)


def _close(actual, expected):
    torch.testing.assert_close(actual.float(), torch.as_tensor(expected).float(), rtol=1e-5, atol=1e-6)


def test_reinforce_plus_plus_carries_the_return_over_masked_tokens():
    # G_t = r_t + γ·G_{t+1} on masked tokens; a masked position (a tool's output) passes G through unchanged,
    # so the reward 2 after the hole reaches token 0 and the masked reward 5 counts nowhere.
    _, returns = compute_reinforce_plus_plus_outcome_advantage(
        torch.tensor([[1.0, 5.0, 2.0]]), torch.tensor([[1.0, 0.0, 1.0]]), gamma=0.5
    )
    _close(returns, [[1 + 0.5 * 2, 0.0, 2.0]])


def test_opo_length_weighted_baseline():
    # group a: s = (1, 0), |y| = (2, 1): b = (2·1 + 1·0) / 3;  c alone: b = 0
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [5.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    adv, ret = compute_opo_outcome_advantage(rewards, mask, np.array(["a", "a", "c"], dtype=object))
    _close(adv, torch.tensor([[1 / 3], [-2 / 3], [5.0]]) * mask)
    assert torch.equal(adv, ret)


def test_gpg_scales_by_the_nonzero_fraction():
    # α = bs / #nonzero = 3 / 2;  A = α·(s − mean_g), a lone response has mean 0
    rewards = torch.tensor([[1.0], [0.0], [5.0]])
    adv, _ = compute_gpg_outcome_advantage(rewards, torch.ones(3, 1), np.array(["a", "a", "c"], dtype=object))
    _close(adv[:, 0], [1.5 * 0.5, 1.5 * -0.5, 1.5 * 5.0])
    zeros, _ = compute_gpg_outcome_advantage(torch.zeros(2, 1), torch.ones(2, 1), np.array(["a", "a"]))
    _close(zeros, torch.zeros(2, 1))  # no nonzero score: α = bs / 1, times 0


def test_grpo_passk_rewards_only_the_best_response():
    # group a: s = (1, 3, 2): only the best learns, A = (3 − 2) / (std + ε), std (unbiased) = 1; group b ties: 0
    rewards = torch.tensor([[1.0], [3.0], [2.0], [4.0], [4.0]])
    index = np.array(["a", "a", "a", "b", "b"], dtype=object)
    adv, _ = compute_grpo_passk_outcome_advantage(rewards, torch.ones(5, 1), index)
    _close(adv[:, 0], [0.0, 1 / (1 + 1e-6), 0.0, 0.0, 0.0])
    raw, _ = compute_grpo_passk_outcome_advantage(rewards, torch.ones(5, 1), index, norm_adv_by_std_in_grpo=False)
    _close(raw[:, 0], [0.0, 1.0, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="at least 2"):
        compute_grpo_passk_outcome_advantage(rewards[:3], torch.ones(3, 1), np.array(["a", "a", "solo"]))


def test_gdpo_normalises_each_component_then_whitens_the_weighted_sum():
    # c1 = (1, 0 | 1, 1), c2 = (0, 0 | 2, 0), groups (0, 1) and (2, 3), weights (1, 2):
    # GRPO(c1) = (h, −h, 0, 0), GRPO(c2) = (0, 0, h, −h) with h = 0.5 / (√0.5 + ε); sum (h, −h, 2h, −2h), whitened
    index = np.array(["a", "a", "b", "b"], dtype=object)
    c1, c2 = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0.0, 0.0, 2.0, 0.0])
    adv, ret = compute_gdpo_outcome_advantage(torch.zeros(4, 1), torch.ones(4, 1), index, [c1, c2], [1.0, 2.0])
    h = 0.5 / (math.sqrt(0.5) + 1e-6)
    total = torch.tensor([h, -h, 2 * h, -2 * h])
    _close(adv[:, 0], total / math.sqrt(float(total.square().sum()) / 3 + 1e-8))
    assert torch.equal(adv, ret)
    # without components it is GRPO on the total score, whitened
    rewards = torch.tensor([[1.0], [0.0], [3.0], [1.0]])
    alone, _ = compute_gdpo_outcome_advantage(rewards, torch.ones(4, 1), index)
    _close(
        alone, ca.masked_whiten(compute_grpo_outcome_advantage(rewards, torch.ones(4, 1), index)[0], torch.ones(4, 1))
    )
    with pytest.raises(ValueError, match="2 reward components"):
        compute_gdpo_outcome_advantage(rewards, torch.ones(4, 1), index, [c1, c2], [1.0])


def test_optimal_token_baseline_hand_group():
    # G = (1, 1) and (0, 0); w = 1 − 2π + Σπ² with π = 0.5: (0.5, 0.3) and (0.3, 0.5), so W = (0.5, 0.8), (0.3, 0.8);
    # B_0 = (1·0.5) / 0.8, B_1 = (1·0.8) / 1.6;  A = G − B
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    old_log_probs = torch.full((2, 2), math.log(0.5))
    sum_pi_squared = torch.tensor([[0.5, 0.3], [0.3, 0.5]])
    adv, ret = compute_optimal_token_baseline_advantage(
        rewards, torch.ones(2, 2), np.array(["g", "g"]), old_log_probs, sum_pi_squared
    )
    _close(ret, [[1.0, 1.0], [0.0, 0.0]])
    _close(adv, [[1 - 0.625, 1 - 0.5], [-0.625, -0.5]])


def test_optimal_token_baseline_zero_tail_and_singletons():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [2.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    index = np.array(["g", "g", "g", "solo"], dtype=object)
    old = torch.log(torch.rand(4, 3, generator=torch.Generator().manual_seed(0)))
    sq = torch.rand(4, 3, generator=torch.Generator().manual_seed(1))
    adv, ret = compute_optimal_token_baseline_advantage(rewards, mask, index, old, sq)
    plain, _ = compute_optimal_token_baseline_advantage(rewards, mask, index, old, sq, handle_zero_tail=False)
    # the group's one longest response (3 tokens vs 1) is its own baseline past position 1: B = 0 there
    _close(adv[0, 1:], ret[0, 1:])
    assert not torch.allclose(plain[0, 1:], ret[0, 1:])
    _close(adv[:, :1], plain[:, :1])
    _close(adv[3], ret[3] * mask[3])  # a lone response: no baseline


# ----------------------------------------------------------------------------------------------- registry


def _registry_batch(seed: int = 3, bs: int = 12, length: int = 6):
    """Random rewards and every estimator input; groups of 2 to 4 (pass@k needs two), right-padded masks."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (bs,), generator=gen)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    rewards = torch.randn(bs, length, generator=gen) * mask
    index = np.array([f"g{g}" for g, size in enumerate((2, 3, 3, 4)) for _ in range(size)], dtype=object)
    inputs = dict(
        values=torch.randn(bs, length, generator=gen),
        index=index,
        reward_baselines=torch.randn(bs, generator=gen),
        old_log_probs=torch.log(torch.rand(bs, length, generator=gen)),
        sum_pi_squared=torch.rand(bs, length, generator=gen),
        reward_components=[torch.randn(bs, generator=gen), torch.randn(bs, generator=gen)],
    )
    return rewards, mask, inputs


@pytest.mark.parametrize("name", list(ca.ADV_ESTIMATORS))
def test_every_estimator_dispatches_with_zero_padding(name):
    rewards, mask, inputs = _registry_batch()
    adv, ret = ca.compute_advantage(name, token_level_rewards=rewards, response_mask=mask, gamma=0.9, **inputs)
    assert adv.shape == ret.shape == rewards.shape
    assert torch.all(adv[mask == 0] == 0)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert set(ca.ADV_ESTIMATORS[name].needs) <= set(ca.ESTIMATOR_INPUTS)


def test_options_come_from_the_algorithm_config_unless_given():
    rewards, mask, inputs = _registry_batch(4)
    index = inputs["index"]
    dr = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)[0]
    config = AlgorithmConfig(adv_estimator="grpo", norm_adv_by_std_in_grpo=False, gamma=0.5)
    for name in ("grpo", "grpo_vectorized"):  # verl's grpo_vectorized ignores the key; ColoRL honours it
        _close(
            ca.compute_advantage(name, token_level_rewards=rewards, response_mask=mask, index=index, config=config)[0],
            dr,
        )
    given = ca.compute_advantage(
        "grpo",
        token_level_rewards=rewards,
        response_mask=mask,
        index=index,
        config=config,
        norm_adv_by_std_in_grpo=True,
    )[0]
    _close(given, compute_grpo_outcome_advantage(rewards, mask, index)[0])
    rpp = ca.compute_advantage("reinforce_plus_plus", token_level_rewards=rewards, response_mask=mask, config=config)
    _close(rpp[1], compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)[1])


def test_unknown_estimator_or_argument_is_named():
    with pytest.raises(ValueError, match="grpo") as err:
        ca.compute_advantage("ppo2", token_level_rewards=torch.zeros(1, 1), response_mask=torch.ones(1, 1))
    assert all(name in str(err.value) for name in ca.ADV_ESTIMATORS)
    with pytest.raises(TypeError, match="valuez"):
        ca.compute_advantage(
            "gae", token_level_rewards=torch.zeros(1, 1), response_mask=torch.ones(1, 1), valuez=torch.zeros(1, 1)
        )


@pytest.mark.parametrize(
    ("name", "missing"),
    [("gae", "values"), ("grpo", "index"), ("remax", "reward_baselines"), ("optimal_token_baseline", "sum_pi_squared")],
)
def test_missing_input_is_named(name, missing):
    given = {"index": np.array(["a", "a"]), "old_log_probs": torch.zeros(2, 3)}
    given.pop(missing, None)
    with pytest.raises(ValueError, match=missing):
        ca.compute_advantage(name, token_level_rewards=torch.zeros(2, 3), response_mask=torch.ones(2, 3), **given)


def test_estimator_needs():
    assert [n for n in ca.ADV_ESTIMATORS if ca.estimator_needs_critic(n)] == ["gae"]
    assert [n for n in ca.ADV_ESTIMATORS if ca.estimator_needs(n, "reward_baselines")] == ["remax"]
    otb = ["optimal_token_baseline", "tir_optimal_token_baseline"]
    assert [n for n in ca.ADV_ESTIMATORS if ca.estimator_needs(n, "sum_pi_squared")] == otb
    with pytest.raises(ValueError, match="gae"):
        ca.estimator_needs("nope", "values")
