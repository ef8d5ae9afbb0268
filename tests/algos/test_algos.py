"""Hand-worked examples and plain-Python loop references for the algos package."""

import math
from collections import defaultdict

import numpy as np
import pytest
import torch

import algos as ca
from algos.advantages import (
    compute_gae_advantage_return,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
)
from algos.group_estimators import (
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)

torch.set_num_threads(1)
SEEDS = range(5)


# ------------------------------------------------------------------------------------------------ helpers


def _random_batch(seed: int, bs: int = 12, length: int = 7):
    """Random rewards/values with a right-padded mask and uid groups of mixed sizes (including singletons)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (bs,), generator=gen)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    rewards = torch.randn(bs, length, generator=gen) * mask
    values = torch.randn(bs, length, generator=gen)
    group_sizes, left = [], bs
    while left:
        group_sizes.append(min(left, int(torch.randint(1, 5, (1,), generator=gen))))
        left -= group_sizes[-1]
    uids = [f"uid{g}" for g, size in enumerate(group_sizes) for _ in range(size)]
    order = torch.randperm(bs, generator=gen).tolist()
    index = np.array([uids[i] for i in order], dtype=object)
    return rewards, values, mask, index


def _row_len(mask_row) -> int:
    return int(mask_row.sum())


def _whiten_ref(rows: list[list[float]]) -> list[list[float]]:
    flat = [x for row in rows for x in row]
    mean = sum(flat) / len(flat)
    var = sum((x - mean) ** 2 for x in flat) / (len(flat) - 1)
    return [[(x - mean) / math.sqrt(var + 1e-8) for x in row] for row in rows]


def _pad(rows: list[list[float]], length: int) -> torch.Tensor:
    return torch.tensor([row + [0.0] * (length - len(row)) for row in rows])


def _group_lists(scores, index):
    groups = defaultdict(list)
    for s, uid in zip(scores, index):
        groups[uid].append(s)
    return groups


def _close(actual, expected, mask=None):
    if mask is not None:
        actual, expected = actual * mask, expected * mask
    torch.testing.assert_close(actual.float(), expected.float(), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------- masked stats


def test_masked_stats_hand_values():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert ca.masked_sum(x, m).item() == 6.0
    _close(ca.masked_sum(x, m, dim=-1), torch.tensor([3.0, 3.0]))
    assert ca.masked_mean(x, m).item() == pytest.approx(2.0)
    _close(ca.masked_mean(x, m, dim=-1), torch.tensor([1.5, 3.0]))
    assert ca.masked_var(x, m).item() == pytest.approx(1.0)  # {1,2,3}: unbiased var 1
    assert ca.masked_var(x, m, unbiased=False).item() == pytest.approx(2 / 3)
    assert ca.masked_mean(x, torch.zeros_like(m)).item() == 0.0  # all masked: 0, not NaN


def test_masked_var_needs_two_elements():
    with pytest.raises(ValueError, match="at least 2"):
        ca.masked_var(torch.ones(1, 3), torch.tensor([[1.0, 0.0, 0.0]]))


def test_masked_whiten_moments():
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0)) * 3 + 5
    m = (torch.rand(4, 6, generator=torch.Generator().manual_seed(1)) > 0.3).float()
    w = ca.masked_whiten(x, m)
    assert ca.masked_mean(w, m).item() == pytest.approx(0.0, abs=1e-5)
    assert ca.masked_var(w, m).item() == pytest.approx(1.0, abs=1e-4)
    kept = ca.masked_whiten(x, m, shift_mean=False)
    assert ca.masked_mean(kept, m).item() == pytest.approx(ca.masked_mean(x, m).item(), abs=1e-4)


# --------------------------------------------------------------------------------------------------- GAE


def test_gae_gamma_lambda_one_is_reward_to_go_minus_value():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.5, 2.0, 0.0, 0.0]])
    values = torch.tensor([[0.1, 0.2, 0.3, 9.0], [1.0, -1.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=1.0)
    reward_to_go = torch.tensor([[1.0, 1.0, 1.0, 0.0], [2.5, 2.0, 0.0, 0.0]])
    _close(ret, reward_to_go, mask)
    _close(adv, ca.masked_whiten(reward_to_go - values, mask) * mask)
    assert torch.all(adv[mask == 0] == 0)


def test_gae_carries_through_masked_positions():
    rewards, values = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[0.1, 0.2, 0.3]])
    # The same row with a masked hole (arbitrary reward/value) in position 1.
    holed_r, holed_v = torch.tensor([[1.0, 5.0, 2.0, 3.0]]), torch.tensor([[0.1, 7.0, 0.2, 0.3]])
    holed_m = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    _, ret = compute_gae_advantage_return(rewards, values, torch.ones(1, 3), gamma=0.9, lam=0.8)
    _, holed_ret = compute_gae_advantage_return(holed_r, holed_v, holed_m, gamma=0.9, lam=0.8)
    _close(holed_ret[:, [0, 2, 3]], ret)


@pytest.mark.parametrize("seed", SEEDS)
def test_gae_matches_loop_reference(seed):
    rewards, values, mask, _ = _random_batch(seed)
    gamma, lam = 0.9 + 0.02 * seed, 0.8 + 0.03 * seed
    raw, ret = [], []
    for i in range(len(rewards)):
        n, r, v = _row_len(mask[i]), rewards[i].tolist(), values[i].tolist()
        a_row, next_v, last = [0.0] * n, 0.0, 0.0
        for t in reversed(range(n)):
            last = r[t] + gamma * next_v - v[t] + gamma * lam * last
            a_row[t], next_v = last, v[t]
        raw.append(a_row)
        ret.append([a + v[t] for t, a in enumerate(a_row)])
    adv, returns = compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    _close(returns, _pad(ret, mask.shape[1]), mask)
    _close(adv, _pad(_whiten_ref(raw), mask.shape[1]))


# ------------------------------------------------------------------------------------ outcome estimators


def test_grpo_hand_groups():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [2.0, 0.0], [1.0, 1.0], [5.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    index = np.array(["a", "a", "b", "b", "c"], dtype=object)
    adv, ret = compute_grpo_outcome_advantage(rewards, mask, index)
    # a: scores {1, 0}, mean .5, std sqrt(.5); b: equal scores give 0; c: singleton, mean 0 std 1.
    half = 0.5 / (math.sqrt(0.5) + 1e-6)
    _close(adv[:, 0], torch.tensor([half, -half, 0.0, 0.0, 5.0 / (1 + 1e-6)]))
    assert adv[1, 1] == 0 and torch.equal(adv, ret)
    dr_adv, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    _close(dr_adv[:, 0], torch.tensor([0.5, -0.5, 0.0, 0.0, 5.0]))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_matches_loop_reference(seed, norm):
    rewards, _, mask, index = _random_batch(seed)
    scores = rewards.sum(-1).tolist()
    groups = _group_lists(scores, index)
    expected = []
    for s, uid in zip(scores, index):
        g = groups[uid]
        mean = sum(g) / len(g) if len(g) > 1 else 0.0
        std = math.sqrt(sum((x - mean) ** 2 for x in g) / (len(g) - 1)) if len(g) > 1 else 1.0
        expected.append((s - mean) / (std + 1e-6) if norm else s - mean)
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    _close(adv, torch.tensor(expected)[:, None] * mask)


def test_rloo_hand_groups():
    rewards = torch.tensor([[1.0], [2.0], [3.0], [7.0]])
    index = np.array(["g", "g", "g", "solo"], dtype=object)
    adv, _ = compute_rloo_outcome_advantage(rewards, torch.ones(4, 1), index)
    _close(adv[:, 0], torch.tensor([1 - 2.5, 2 - 2.0, 3 - 1.5, 7.0]))  # verl's rloo: a lone response keeps s
    vectorized, _ = compute_rloo_vectorized_outcome_advantage(rewards, torch.ones(4, 1), index)
    _close(vectorized[:, 0], torch.tensor([1 - 2.5, 2 - 2.0, 3 - 1.5, 0.0]))  # rloo_vectorized: 0


@pytest.mark.parametrize("seed", SEEDS)
def test_rloo_matches_loop_reference(seed):
    rewards, _, mask, index = _random_batch(seed)
    scores = rewards.sum(-1).tolist()
    groups = _group_lists(scores, index)
    expected = []
    for s, uid in zip(scores, index):
        others = len(groups[uid]) - 1
        expected.append(s - (sum(groups[uid]) - s) / others if others else s)
    adv, ret = compute_rloo_outcome_advantage(rewards, mask, index)
    _close(adv, torch.tensor(expected)[:, None] * mask)
    assert torch.equal(adv, ret)


@pytest.mark.parametrize("seed", SEEDS)
def test_reinforce_plus_plus_matches_loop_reference(seed):
    rewards, _, mask, _ = _random_batch(seed)
    gamma = 0.95
    rows = []
    for i in range(len(rewards)):
        n, r, running = _row_len(mask[i]), rewards[i].tolist(), 0.0
        row = [0.0] * n
        for t in reversed(range(n)):
            running = r[t] + gamma * running
            row[t] = running
        rows.append(row)
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma)
    _close(ret, _pad(rows, mask.shape[1]))
    _close(adv, _pad(_whiten_ref(rows), mask.shape[1]))


@pytest.mark.parametrize("seed", SEEDS)
def test_reinforce_plus_plus_baseline_matches_loop_reference(seed):
    rewards, _, mask, index = _random_batch(seed)
    scores = rewards.sum(-1).tolist()
    groups = _group_lists(scores, index)
    rows = []
    for i, (s, uid) in enumerate(zip(scores, index)):
        mean = sum(groups[uid]) / len(groups[uid]) if len(groups[uid]) > 1 else 0.0
        rows.append([s - mean] * _row_len(mask[i]))
    adv, _ = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, index)
    _close(adv, _pad(_whiten_ref(rows), mask.shape[1]))


@pytest.mark.parametrize("seed", SEEDS)
def test_remax_matches_loop_reference(seed):
    rewards, _, mask, _ = _random_batch(seed)
    baselines = torch.randn(len(rewards), generator=torch.Generator().manual_seed(seed))
    ret_rows, adv_rows = [], []
    for i in range(len(rewards)):
        n, r = _row_len(mask[i]), rewards[i].tolist()
        ret_rows.append([sum(r[t:n]) for t in range(n)])
        adv_rows.append([g - baselines[i].item() for g in ret_rows[-1]])
    adv, ret = compute_remax_outcome_advantage(rewards, baselines, mask)
    _close(ret, _pad(ret_rows, mask.shape[1]))
    _close(adv, _pad(adv_rows, mask.shape[1]))


# OTB's baseline is aligned by position, by design (verl's too): tir_optimal_token_baseline is its multi-turn form
@pytest.mark.parametrize("name", sorted(set(ca.ADV_ESTIMATORS) - {"optimal_token_baseline"}))
def test_every_estimator_skips_tool_turns_inside_a_response(name):
    """A multi-turn response's tool tokens are holes in the mask (with any value under them): at the model's tokens
    every estimator gives what it gives on the response with the holes removed."""
    g = torch.Generator().manual_seed(3)
    bs, model_tokens, holes = 6, 8, [2, 3, 6]  # tool turns after model tokens 2 and 6 (three tool tokens)
    compact_mask = torch.ones(bs, model_tokens)
    compact_mask[::2, -2:] = 0  # some responses end early
    compact_rewards = torch.zeros(bs, model_tokens)
    ends = compact_mask.sum(-1).long() - 1
    compact_rewards[torch.arange(bs), ends] = torch.randn(bs, generator=g)
    compact_values = torch.randn(bs, model_tokens, generator=g)
    keep = [t for t in range(model_tokens + len(holes)) if t not in holes]
    mask, rewards = torch.zeros(bs, model_tokens + len(holes)), torch.zeros(bs, model_tokens + len(holes))
    compact_log_probs = -torch.rand(bs, model_tokens, generator=g)
    compact_pi2 = torch.rand(bs, model_tokens, generator=g)
    values = torch.randn(bs, model_tokens + len(holes), generator=g)  # anything under the holes
    log_probs = -torch.rand(bs, model_tokens + len(holes), generator=g)
    pi2 = torch.rand(bs, model_tokens + len(holes), generator=g)
    mask[:, keep], rewards[:, keep], values[:, keep] = compact_mask, compact_rewards, compact_values
    log_probs[:, keep], pi2[:, keep] = compact_log_probs, compact_pi2
    index = np.array(["a", "a", "b", "b", "c", "c"], dtype=object)
    components = [torch.randn(bs, generator=g), torch.randn(bs, generator=g)]

    def advantages(r, v, m, lp, sp):
        return ca.compute_advantage(
            name,
            token_level_rewards=r,
            response_mask=m,
            values=v,
            index=index,
            reward_baselines=torch.linspace(-1, 1, bs),
            gamma=0.9,
            lam=0.95,
            old_log_probs=lp,
            sum_pi_squared=sp,
            reward_components=components,
        )

    adv, ret = advantages(rewards, values, mask, log_probs, pi2)
    compact_adv, compact_ret = advantages(compact_rewards, compact_values, compact_mask, compact_log_probs, compact_pi2)
    _close(adv[:, keep], compact_adv)
    _close(ret[:, keep] * compact_mask, compact_ret * compact_mask)
    assert adv[:, holes].abs().max() == 0


# ------------------------------------------------------------------------------------------ log-probs & KL


def test_entropy_from_logits():
    assert ca.entropy_from_logits(torch.zeros(2, 8)).tolist() == pytest.approx([math.log(8)] * 2)
    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0))
    probs = torch.softmax(logits, -1)
    _close(ca.entropy_from_logits(logits), -(probs * probs.log()).sum(-1))
    peaked = torch.tensor([[1e4, 0.0, -1e4]])  # naive p·log p would give NaN here
    assert ca.entropy_from_logits(peaked).item() == pytest.approx(0.0, abs=1e-6)


def test_logprobs_from_logits_matches_log_softmax():
    logits = torch.randn(2, 5, 13, generator=torch.Generator().manual_seed(1)) * 4
    labels = torch.randint(0, 13, (2, 5), generator=torch.Generator().manual_seed(2))
    expected = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    _close(ca.logprobs_from_logits(logits, labels), expected)


def test_kl_penalty_hand_values():
    logp, ref = torch.tensor([-1.0, 0.0, -100.0]), torch.tensor([-2.0, -100.0, 0.0])
    assert ca.kl_penalty(logp, ref, "kl")[0].item() == pytest.approx(1.0)
    assert torch.equal(ca.kl_penalty(logp, ref, "k1"), ca.kl_penalty(logp, ref, "kl"))
    assert ca.kl_penalty(-logp, -ref, "abs")[0].item() == pytest.approx(1.0)
    assert ca.kl_penalty(logp, ref, "mse")[0].item() == pytest.approx(0.5)
    assert torch.equal(ca.kl_penalty(logp, ref, "k2"), ca.kl_penalty(logp, ref, "mse"))
    k3 = ca.kl_penalty(logp, ref, "low_var_kl")
    assert k3[0].item() == pytest.approx(math.exp(-1))  # e^{-1} − (−1) − 1
    assert k3[1:].tolist() == [10.0, 10.0]  # both extremes hit the ±20 input / 10 output clamps
    assert torch.equal(ca.kl_penalty(logp, ref, "k3"), k3)


def test_kl_penalty_rejects_full_and_unknown():
    x = torch.zeros(2)
    with pytest.raises(ValueError, match="kl_full"):
        ca.kl_penalty(x, x, "full")
    with pytest.raises(ValueError, match="low_var_kl") as err:
        ca.kl_penalty(x, x, "k4")
    assert all(name in str(err.value) for name in ca.KL_PENALTY_TYPES)


@pytest.mark.parametrize("seed", range(3))
def test_kl_full_is_the_exact_vocabulary_sum(seed):
    torch.manual_seed(seed)
    logits, ref_logits = torch.randn(3, 4, 11) * 2, torch.randn(3, 4, 11) * 2
    p, q = torch.softmax(logits, -1), torch.softmax(ref_logits, -1)
    expected = torch.zeros(3, 4)
    for v in range(11):  # the definition, one vocabulary entry at a time
        expected += p[..., v] * (p[..., v].log() - q[..., v].log())
    kl = ca.kl_full(logits, ref_logits)
    torch.testing.assert_close(kl, expected, rtol=1e-5, atol=1e-6)
    assert (kl >= 0).all() and ca.kl_full(logits, logits).abs().max() < 1e-6
    # it is the expectation of k1 under π: Σ_v π(v)·k1(v)
    k1 = ca.kl_penalty(torch.log_softmax(logits, -1), torch.log_softmax(ref_logits, -1), "k1")
    torch.testing.assert_close((p * k1).sum(-1), kl, rtol=1e-5, atol=1e-6)


def test_kl_full_gradient_flows_through_the_policy_only():
    logits, ref_logits = torch.randn(2, 5, requires_grad=True), torch.randn(2, 5, requires_grad=True)
    ca.kl_full(logits, ref_logits).sum().backward()
    assert logits.grad.abs().sum() > 0 and ref_logits.grad is None


def test_kl_controllers():
    fixed = ca.get_kl_controller("fixed", kl_coef=0.1)
    fixed.update(current_kl=5.0, n_steps=8)
    assert fixed.value == 0.1
    up = ca.get_kl_controller("adaptive", kl_coef=0.1, target_kl=0.1, horizon=100)
    up.update(current_kl=1.0, n_steps=10)  # error clipped to +0.2
    assert up.value == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))
    down = ca.AdaptiveKLController(0.1, target_kl=0.1, horizon=100)
    down.update(current_kl=0.09, n_steps=10)  # error −0.1
    assert down.value == pytest.approx(0.1 * (1 - 0.1 * 10 / 100))
    restored = ca.AdaptiveKLController(0.5, target_kl=0.1, horizon=100)
    restored.load_state_dict(up.state_dict())
    assert restored.value == up.value
    with pytest.raises(ValueError, match="horizon"):
        ca.AdaptiveKLController(0.1, target_kl=0.1, horizon=0)
    with pytest.raises(ValueError, match="adaptive"):
        ca.get_kl_controller("pid", kl_coef=0.1)


def test_apply_kl_penalty():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    old = torch.tensor([[0.2, 0.4, 9.0], [0.0, 0.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    ctrl = ca.AdaptiveKLController(0.5, target_kl=0.01, horizon=10)
    rewards, metrics = ca.apply_kl_penalty(scores, old, torch.zeros_like(old), mask, ctrl, "kl")
    _close(rewards, torch.tensor([[-0.1, -0.2, 1.0], [0.0, 2.0, 0.0]]))
    assert metrics["actor/reward_kl_penalty"] == pytest.approx((0.3 + 0.0) / 2)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.5
    assert ctrl.value == pytest.approx(0.5 * (1 + 0.2 * 2 / 10))  # KL above target -> β grows
