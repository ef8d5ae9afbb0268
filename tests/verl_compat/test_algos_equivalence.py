"""The same numbers as verl 0.9.1 itself: every estimator's advantages and returns, every policy loss's value,
gradient and metrics under every aggregation mode, agg_loss and the value loss, on the same random tensors; and the
door's verl signatures (verl_compat.trainer.ppo.core_algos) called as verl's.

verl is a test-only dependency (``make setup`` installs it with --no-deps); without it these tests skip.
"""

import dataclasses
import inspect
import os

import numpy as np
import pytest
import torch

import algos as ca
from config.schema import AlgorithmConfig
from config.sections import ActorConfig, PolicyLossConfig, RolloutCorrectionConfig
from verl_compat.trainer.ppo import core_algos as door_algos

_environ = set(os.environ)
verl = pytest.importorskip("verl", reason="verl is not installed (make setup installs verl==0.9.1 for the tests)")
if verl.__version__ != "0.9.1":
    pytest.skip(f"these tests compare with verl 0.9.1, found {verl.__version__}", allow_module_level=True)
from verl.trainer.config import AlgoConfig as VerlAlgoConfig  # noqa: E402
from verl.trainer.config import RolloutCorrectionConfig as VerlRolloutCorrection  # noqa: E402
from verl.trainer.ppo import core_algos as verl_algos  # noqa: E402
from verl.workers.config import FSDPActorConfig as VerlActorConfig  # noqa: E402
from verl.workers.config import PolicyLossConfig as VerlPolicyLossConfig  # noqa: E402

for _name in set(os.environ) - _environ:  # importing verl sets defaults for Ray; the later tests must not see them
    del os.environ[_name]

torch.set_num_threads(1)
BS, P, R = 12, 3, 7
GROUPS = (3, 1, 2, 2, 4)  # one lone response; the pass@k case drops it
TOL = dict(rtol=2e-5, atol=2e-6)


def _batch(seed: int, holes: bool = False):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, R + 1, (BS,), generator=gen)
    mask = (torch.arange(R)[None, :] < lengths[:, None]).float()
    if holes:  # masked positions inside responses (multi-turn observation tokens)
        mask = mask * (torch.rand(BS, R, generator=gen) > 0.25).float()
        mask[:, 0] = 1.0
    rewards = torch.randn(BS, R, generator=gen) * mask
    rewards[torch.rand(BS, generator=gen) < 0.3] = 0.0  # some responses score 0 (GPG's α counts them)
    index = np.array([f"uid{g}" for g, size in enumerate(GROUPS) for _ in range(size)], dtype=object)
    return rewards, mask, index, gen


def _same(actual, expected):
    torch.testing.assert_close(actual.float(), expected.float(), **TOL)


# ------------------------------------------------------------------------------------------- estimators


@pytest.mark.parametrize("holes", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_estimators_match_verl(seed, holes):
    rewards, mask, index, gen = _batch(seed, holes)
    values, baselines = torch.randn(BS, R, generator=gen), torch.randn(BS, generator=gen)
    old_log_probs, sum_pi_squared = torch.log(torch.rand(BS, R, generator=gen)), torch.rand(BS, R, generator=gen)
    components = {"format": torch.randn(BS, generator=gen), "accuracy": (torch.rand(BS, generator=gen) > 0.5).float()}
    inputs = dict(
        values=values,
        index=index,
        reward_baselines=baselines,
        old_log_probs=old_log_probs,
        sum_pi_squared=sum_pi_squared,
        reward_components=list(components.values()),
    )
    for norm in (True, False):
        ours = AlgorithmConfig(
            adv_estimator="gdpo",
            gamma=0.9,
            lam=0.8,
            norm_adv_by_std_in_grpo=norm,
            gdpo_reward_keys=list(components),
            gdpo_reward_weights=[0.7, 1.3],
        )
        theirs = VerlAlgoConfig(
            gamma=0.9,
            lam=0.8,
            norm_adv_by_std_in_grpo=norm,
            gdpo_reward_keys=list(components),
            gdpo_reward_weights=[0.7, 1.3],
        )
        for name in ca.ADV_ESTIMATORS:
            rows = torch.as_tensor(index != "uid1")
            if name == "grpo_passk":
                keep = index != "uid1"
                got = ca.compute_advantage(
                    name, token_level_rewards=rewards[rows], response_mask=mask[rows], config=ours, index=index[keep]
                )
                want = verl_algos.compute_grpo_passk_outcome_advantage(
                    rewards[rows], mask[rows], index[keep], config=theirs
                )
            else:
                got = ca.compute_advantage(name, token_level_rewards=rewards, response_mask=mask, config=ours, **inputs)
                want = _verl_estimator(name, rewards, mask, inputs, theirs, components)
            m = mask[rows] if name == "grpo_passk" else mask
            for a, b in zip(got, want):  # verl's GAE leaves whitened values on padding; ColoRL zeroes them
                _same(a * m, b * m)


def _verl_estimator(name, rewards, mask, inputs, config, components):
    """verl's estimator ``name`` called as verl's trainer calls it, except that flags its dispatch drops for
    grpo_vectorized and gdpo (norm_adv_by_std_in_grpo) are passed, as ColoRL's dispatch does."""
    fn = verl_algos.get_adv_estimator_fn(name)
    common = dict(token_level_rewards=rewards, response_mask=mask)
    if name == "gae":
        return fn(values=inputs["values"], gamma=config.gamma, lam=config.lam, **common)
    if name in ("grpo", "grpo_vectorized"):
        return fn(index=inputs["index"], norm_adv_by_std_in_grpo=config.norm_adv_by_std_in_grpo, **common)
    if name == "gdpo":
        prompts = torch.zeros(BS, P, dtype=torch.long)
        attention_mask = torch.cat([torch.ones(BS, P), (torch.arange(R)[None, :] < _ends(mask)[:, None])], 1).long()
        return fn(
            index=inputs["index"],
            config=config,
            norm_adv_by_std_in_grpo=config.norm_adv_by_std_in_grpo,
            non_tensor_batch={k: v.numpy() for k, v in components.items()},
            batch={"prompts": prompts, "attention_mask": attention_mask},
            **common,
        )
    if name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        return fn(
            index=inputs["index"],
            old_log_probs=inputs["old_log_probs"],
            sum_pi_squared=inputs["sum_pi_squared"],
            **common,
        )
    extra = {"reward_baselines": inputs["reward_baselines"]} if name == "remax" else {"index": inputs["index"]}
    return fn(config=config, **extra, **common)


def _ends(mask):
    """One past each response's last valid position (verl puts a GDPO component's score on the token before)."""
    return (mask * torch.arange(1, R + 1)).amax(dim=-1)


# ----------------------------------------------------------------------------------------------- losses


OPTIONS = dict(clip_ratio_low=0.15, clip_ratio_high=0.28, clip_ratio_c=2.5, tau_pos=1.2, tau_neg=1.6)
LOSS_OPTIONS = dict(
    clip_cov_ratio=0.2, clip_cov_lb=0.0, clip_cov_ub=5.0, kl_cov_ratio=0.2, ppo_kl_coef=0.3, dro_beta=0.1
)
CORRECTIONS = {
    "ppo_clip": dict(
        loss_type="ppo_clip", rollout_is="token", rollout_rs="token_k1,seq_mean_k3", rollout_rs_threshold="0.6_1.6,0.05"
    ),
    "reinforce": dict(
        loss_type="reinforce",
        rollout_is="sequence",
        rollout_is_threshold="0.5_2.0",
        rollout_is_batch_normalize=True,
        rollout_rs="seq_max_k2",
        rollout_rs_threshold=0.1,
    ),
    "reinforce_token": dict(
        loss_type="reinforce",
        rollout_is="token",
        rollout_is_threshold=1.5,
        rollout_rs="token_k3,seq_sum_k1",
        rollout_rs_threshold="0.1,0.3_3.0",
    ),
}
CASES = [(mode, None) for mode in ca.POLICY_LOSSES if mode != "bypass_mode"] + [
    ("bypass_mode", name) for name in CORRECTIONS
]


def _configs(loss_mode, agg, correction):
    corr = CORRECTIONS.get(correction, {})
    ours = ActorConfig(
        loss_agg_mode=agg,
        loss_scale_factor=5.0,
        **OPTIONS,
        policy_loss=PolicyLossConfig(
            loss_mode=loss_mode, rollout_correction=RolloutCorrectionConfig(**corr), **LOSS_OPTIONS
        ),
    )
    theirs = VerlActorConfig(
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=agg,
        **OPTIONS,
        policy_loss=VerlPolicyLossConfig(
            loss_mode=loss_mode, **LOSS_OPTIONS, rollout_correction=VerlRolloutCorrection(**corr)
        ),
    )
    theirs.global_batch_info["loss_scale_factor"] = 5.0  # what verl's ppo_loss sets from actor.loss_scale_factor
    return ours, theirs


@pytest.mark.parametrize("agg", ca.LOSS_AGG_MODES)
@pytest.mark.parametrize(("loss_mode", "correction"), CASES)
def test_policy_losses_match_verl(loss_mode, correction, agg):
    _, mask, _, gen = _batch(7)
    old = torch.log(torch.rand(BS, R, generator=gen) * 0.9 + 0.05)
    # most rows near the old policy, a few far from it (clips, dual clip, GSPO's unclipped A < 0 side)
    shift = torch.tensor([0.0, 0.0, 0.0, 1.0, -1.0, 0.0, 2.5, 0.0, 0.0, -0.5, 0.0, 2.0]).unsqueeze(-1)
    old = torch.where(shift > 0, old - 3.0, old)  # room below log 1 for the far rows to move up
    new = (old + shift + 0.3 * torch.randn(BS, R, generator=gen)).clamp(max=-1e-3)
    adv = torch.randn(BS, R, generator=gen) * mask
    ours, theirs = _configs(loss_mode, agg, correction)
    mine, verls = new.clone().requires_grad_(), new.clone().requires_grad_()
    torch.manual_seed(0)  # clip_cov draws its tokens from torch's global RNG
    loss, metrics = ca.compute_policy_loss(loss_mode, old, mine, adv, mask, agg, config=ours, rollout_log_probs=old)
    torch.manual_seed(0)
    want, want_metrics = verl_algos.get_policy_loss_fn(loss_mode)(old, verls, adv, mask, agg, theirs)
    _same(loss.detach(), want.detach())
    loss.backward()
    want.backward()
    _same(mine.grad, verls.grad)
    assert set(metrics) - set(want_metrics) == {"actor/pg_loss"}
    for key, value in want_metrics.items():
        assert metrics[key].item() == pytest.approx(value, rel=2e-5, abs=2e-6), key


def test_agg_loss_and_value_loss_match_verl():
    _, mask, _, gen = _batch(11)
    mask[3] = 0.0  # an empty response: the sequence modes leave it out
    loss = torch.randn(BS, R, generator=gen)
    for agg in ca.LOSS_AGG_MODES:
        for given in ({}, dict(loss_scale_factor=4), dict(dp_size=2, batch_num_tokens=60, global_batch_size=30)):
            _same(ca.agg_loss(loss, mask, agg, **given), verl_algos.agg_loss(loss, mask, agg, **given))
        vpreds, returns, values = (torch.randn(BS, R, generator=gen) for _ in range(3))
        got, metrics = ca.compute_value_loss(vpreds, returns, values, mask, 0.3, agg)
        want, clipfrac = verl_algos.compute_value_loss(vpreds, returns, values, mask, 0.3, agg)
        _same(got, want)
        _same(metrics["critic/vf_clipfrac"], clipfrac)


# ------------------------------------------------------------------------------- the door's verl signatures
SAME_CALL = ("grpo", "grpo_vectorized", "grpo_passk", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
SAME_CALL += ("rloo", "rloo_vectorized", "opo", "gpg", "remax")


@pytest.mark.parametrize("name", SAME_CALL)
def test_the_doors_estimators_called_as_verls_trainer_calls_them_match_verl(name):
    """The keywords verl's trainer passes (config=, index, reward_baselines), those verl's function takes, to
    both: the same numbers."""
    rewards, mask, index, gen = _batch(5, holes=True)
    keep = index != "uid1" if name == "grpo_passk" else np.ones(BS, dtype=bool)  # pass@k needs groups of 2
    rewards, mask, index = rewards[torch.as_tensor(keep)], mask[torch.as_tensor(keep)], index[keep]
    given = dict(token_level_rewards=rewards, response_mask=mask, index=index, reward_baselines=torch.randn(len(index)))
    theirs = verl_algos.get_adv_estimator_fn(name)
    params = inspect.signature(theirs).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        given = {key: value for key, value in given.items() if key in params}
    for norm in (True, False):
        config = VerlAlgoConfig(gamma=0.7, norm_adv_by_std_in_grpo=norm)
        got = door_algos.get_adv_estimator_fn(name)(**given, config=config)
        want = theirs(**given, config=config)
        for a, b in zip(got, want):  # off the mask verl's ReMax advantages keep the returns (never read there)
            _same(a * mask, b * mask)


def test_the_doors_value_loss_takes_verls_keywords_and_returns_verls_pair():
    _, mask, _, gen = _batch(12)
    vpreds, returns, values = (torch.randn(BS, R, generator=gen) for _ in range(3))
    for agg in ca.LOSS_AGG_MODES:
        for given in ({}, dict(loss_scale_factor=4), dict(dp_size=2, batch_num_tokens=60, global_batch_size=30)):
            got = door_algos.compute_value_loss(vpreds, returns, values, mask, 0.3, agg, **given)
            want = verl_algos.compute_value_loss(vpreds, returns, values, mask, 0.3, agg, **given)
            for a, b in zip(got, want, strict=True):
                _same(a, b)


def test_the_comparison_sees_every_registered_name():
    assert set(ca.ADV_ESTIMATORS) == set(verl_algos.ADV_ESTIMATOR_REGISTRY)
    assert set(ca.POLICY_LOSSES) == set(verl_algos.POLICY_LOSS_REGISTRY)
    assert set(ca.LOSS_AGG_MODES) == {
        "token-mean",
        "token-sum",
        "seq-mean-token-sum",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
    }
    verl_keys = {f.name for f in dataclasses.fields(VerlPolicyLossConfig) if not f.name.startswith("_")}
    assert verl_keys == {f.name for f in dataclasses.fields(PolicyLossConfig) if f.name != "_target_"}
    read = {name for entry in ca.POLICY_LOSSES.values() for name in entry.options if "." not in name}
    assert read - verl_keys <= {f.name for f in dataclasses.fields(VerlActorConfig)}  # keys verl has, where it has them
    assert {"loss_scale_factor", "calculate_sum_pi_squared"} <= {f.name for f in dataclasses.fields(ActorConfig)}
