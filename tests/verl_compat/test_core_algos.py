"""verl's algorithm signatures (verl_compat.trainer.ppo.core_algos) and the straight-through KL estimators, as
verl 0.9.1's CPU tests state them: ``+`` estimators in algos/ and in the config, the value loss's keywords and
return, the estimators' ``config=``, the vectorized GRPO. No verl needed (the comparison with verl itself:
test_algos_equivalence.py)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import algos
from config import ConfigError
from config.schema import AlgorithmConfig
from planner import load_config
from verl_compat.trainer.ppo import core_algos as door

BASES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def _log_probs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(4, 8, generator=gen).requires_grad_(), torch.randn(4, 8, generator=gen)


def _grad(name: str) -> torch.Tensor:
    logprob, ref = _log_probs()
    (grad,) = torch.autograd.grad(algos.kl_penalty(logprob, ref, name).sum(), logprob)
    return grad


# ---------------------------------------------------------------------------- straight-through KL
@pytest.mark.parametrize("base", BASES)
def test_a_plus_estimator_has_its_bases_value_and_k2s_gradient(base):
    logprob, ref = _log_probs()
    torch.testing.assert_close(algos.kl_penalty(logprob, ref, f"{base}+"), algos.kl_penalty(logprob, ref, base))
    torch.testing.assert_close(_grad(f"{base}+"), _grad("k2"))  # k2's gradient: (log π − log π_ref)·∇log π


def test_k3s_own_gradient_differs_from_k3_plus():
    """The check above would pass for any estimator whose gradient is k2's: k3's is not, so ``+`` changes it."""
    assert not torch.allclose(_grad("k3"), _grad("k3+"))


@pytest.mark.parametrize("name", ["full+", "k9+", "k3++"])
def test_an_unknown_plus_estimator_names_the_valid_ones(name):
    logprob, ref = _log_probs()
    with pytest.raises(ValueError, match=rf"unknown kl_penalty '{name.replace('+', '[+]')}'; valid: .*'k3\+'"):
        algos.kl_penalty(logprob, ref, name)


def test_the_config_takes_plus_estimators_as_verls_command_line_does():
    cfg = load_config(["actor_rollout_ref.actor.kl_loss_type=low_var_kl+", "algorithm.kl_penalty=k3+"])
    assert cfg.actor_rollout_ref.actor.kl_loss_type == "low_var_kl+" and cfg.algorithm.kl_penalty == "k3+"
    with pytest.raises(ConfigError, match="k3[+][+]"):
        load_config(["algorithm.kl_penalty=k3++"])


def test_kl_penalty_forward_is_the_estimator_without_plus():
    logprob, ref = _log_probs()
    torch.testing.assert_close(door.kl_penalty_forward(logprob, ref, "k3"), algos.kl_penalty(logprob, ref, "k3"))
    with pytest.raises(ValueError, match="without '[+]'"):
        door.kl_penalty_forward(logprob, ref, "k3+")


# ---------------------------------------------------------------------------- the value loss
def _value_batch(lengths=(10, 7, 3, 9, 5, 10, 2, 6), seed=0):
    gen = torch.Generator().manual_seed(seed)
    vpreds, values, returns = (torch.randn(len(lengths), 10, generator=gen) for _ in range(3))
    mask = (torch.arange(10)[None, :] < torch.tensor(lengths)[:, None]).float()
    return vpreds, returns, values, mask


@pytest.mark.parametrize("mode", algos.LOSS_AGG_MODES)
@pytest.mark.parametrize("micro", [2, 4])
def test_the_value_loss_of_micro_batches_sums_to_the_whole_with_verls_keywords(mode, micro):
    vpreds, returns, values, mask = _value_batch()
    given = dict(loss_agg_mode=mode, batch_num_tokens=int(mask.sum()), global_batch_size=mask.shape[0])
    whole, clipfrac = door.compute_value_loss(vpreds, returns, values, mask, 0.5, **given)
    step = mask.shape[0] // micro
    parts = [slice(i, i + step) for i in range(0, mask.shape[0], step)]
    summed = sum(door.compute_value_loss(vpreds[p], returns[p], values[p], mask[p], 0.5, **given)[0] for p in parts)
    torch.testing.assert_close(summed, whole)
    own, metrics = algos.compute_value_loss(vpreds, returns, values, mask, 0.5, mode)  # ColoRL's (loss, metrics)
    torch.testing.assert_close(whole, own)
    assert isinstance(clipfrac, torch.Tensor) and clipfrac.item() == metrics["critic/vf_clipfrac"].item()


def test_the_value_loss_over_dp_ranks_averages_to_the_global_token_mean():
    vpreds, returns, values, mask = _value_batch()
    tokens = int(mask.sum())
    truth, _ = door.compute_value_loss(vpreds, returns, values, mask, 0.5, batch_num_tokens=tokens)
    shards = [slice(0, 4), slice(4, 8)]
    ranks = [
        door.compute_value_loss(vpreds[s], returns[s], values[s], mask[s], 0.5, dp_size=2, batch_num_tokens=tokens)
        for s in shards
    ]
    torch.testing.assert_close(sum(loss for loss, _ in ranks) / 2, truth)  # FSDP averages the ranks' gradients
    with pytest.raises(ValueError, match="batch_num_tokens is required when dp_size > 1"):
        door.compute_value_loss(vpreds, returns, values, mask, 0.5, dp_size=2)
    with pytest.raises(ValueError, match="global_batch_size is required"):
        door.compute_value_loss(vpreds, returns, values, mask, 0.5, "seq-mean-token-mean", dp_size=2)


# ---------------------------------------------------------------------------- the estimators' config=
def _outcome(seed=0, groups=(3, 1, 2, 2)):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]]).repeat(sum(groups), 1)  # an observation span inside
    rewards = torch.zeros_like(mask)
    rewards[:, -1] = torch.randn(sum(groups), generator=gen)
    index = np.array([f"g{g}" for g, n in enumerate(groups) for _ in range(n)], dtype=object)
    return rewards, mask, index


@pytest.mark.parametrize("config", [SimpleNamespace(gamma=0.5), {"gamma": 0.5}, AlgorithmConfig(gamma=0.5)])
def test_reinforce_plus_plus_reads_gamma_from_config(config):
    rewards, mask, _ = _outcome()
    got = door.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=config)
    want = algos.compute_advantage("reinforce_plus_plus", token_level_rewards=rewards, response_mask=mask, gamma=0.5)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    # γ skips the observation span: the last reward reaches the second token discounted twice, not four times
    torch.testing.assert_close(got[1][:, 1], 0.25 * rewards[:, -1])
    with pytest.raises(ValueError, match="needs config= .*config.gamma"):
        door.compute_reinforce_plus_plus_outcome_advantage(rewards, mask)


@pytest.mark.parametrize(
    "name", ["rloo", "rloo_vectorized", "reinforce_plus_plus_baseline", "opo", "grpo", "grpo_vectorized", "remax"]
)
def test_the_estimators_take_config_and_verls_other_keywords(name):
    rewards, mask, index = _outcome(1)
    baselines = torch.randn(len(index))
    inputs = {"index": index} if name != "remax" else {"reward_baselines": baselines}
    want = algos.compute_advantage(name, token_level_rewards=rewards, response_mask=mask, **inputs)
    fn = door.get_adv_estimator_fn(name)
    got = fn(token_level_rewards=rewards, response_mask=mask, config=AlgorithmConfig(), **inputs, uid=index)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_pass_at_k_reads_the_std_switch_from_config_as_verls_does():
    rewards, mask, index = _outcome(2, groups=(3, 2, 2))
    given = dict(token_level_rewards=rewards, response_mask=mask, index=index)
    for norm in (True, False):
        config = {"norm_adv_by_std_in_grpo": norm}  # read there; the argument of that name is not
        got = door.compute_grpo_passk_outcome_advantage(**given, norm_adv_by_std_in_grpo=not norm, config=config)
        want = algos.compute_advantage("grpo_passk", **given, norm_adv_by_std_in_grpo=norm)
        torch.testing.assert_close(got[0], want[0])


def test_gpg_divides_by_f_norm_and_recomputes_alpha():
    rewards, mask, index = _outcome(3)
    want, _ = algos.compute_advantage("gpg", token_level_rewards=rewards, response_mask=mask, index=index)
    got, _ = door.compute_gpg_outcome_advantage(rewards, mask, index, f_norm=2.0, alpha=7.0, config=None)
    torch.testing.assert_close(got, want / 2.0)


# ---------------------------------------------------------------------------- vectorized GRPO
@pytest.mark.parametrize("rewards", [[1.0, 1.00001, 2.0, 2.00001], [0.3, -1.2, 2.0, 0.5]])
def test_vectorized_grpo_is_grpo_in_algos_and_in_the_door(rewards):
    scores = torch.tensor(rewards)[:, None]
    index = np.array(["a", "a", "b", "b"], dtype=object)
    mask = torch.ones_like(scores)
    want = algos.group_estimators.compute_grpo_outcome_advantage(scores, mask, index)
    named = algos.group_estimators.compute_grpo_vectorized_outcome_advantage(scores, mask, index)
    got = door.compute_grpo_vectorized_outcome_advantage(scores, mask, index, config=None)
    for a, b, c in zip(got, want, named, strict=True):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(c, b)


def test_get_adv_estimator_fn_takes_names_and_enums_and_names_the_valid_ones():
    assert door.get_adv_estimator_fn(SimpleNamespace(value="rloo")) is door.compute_rloo_outcome_advantage
    assert door.get_adv_estimator_fn("gae") is algos.advantages.compute_gae_advantage_return
    with pytest.raises(ValueError, match="unknown .*'nope'.*valid"):
        door.get_adv_estimator_fn("nope")


def test_get_kl_controller_reads_verls_kl_ctrl_section():
    adaptive = door.get_kl_controller(SimpleNamespace(type="adaptive", kl_coef=0.2, target_kl=0.05, horizon=100))
    assert isinstance(adaptive, algos.AdaptiveKLController) and adaptive.value == 0.2 and adaptive.horizon == 100
    fixed = door.get_kl_controller({"type": "fixed", "kl_coef": 0.1})
    assert isinstance(fixed, algos.FixedKLController) and fixed.value == 0.1
