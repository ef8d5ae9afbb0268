"""Loss aggregation, every policy loss worked by hand (value, gradient, metrics), the loss registry, the value loss."""

import dataclasses
import math

import pytest
import torch

import algos as ca
from algos import policy_losses as pl
from config.sections import ActorConfig, PolicyLossConfig

torch.set_num_threads(1)


def _close(actual, expected, **tol):
    torch.testing.assert_close(
        torch.as_tensor(actual).float(), torch.as_tensor(expected).float(), **(tol or {"rtol": 1e-5, "atol": 1e-6})
    )


def _logp(values):
    """Log-probs that carry a gradient, from a nested list of log-probs."""
    return torch.tensor(values).requires_grad_()


def _actor(**keys) -> ActorConfig:
    loss_keys = {k: keys.pop(k) for k in list(keys) if k in {f.name for f in dataclasses.fields(PolicyLossConfig)}}
    return ActorConfig(policy_loss=PolicyLossConfig(**loss_keys), **keys)


# ------------------------------------------------------------------------------------------- aggregation

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # the third response is empty


def test_agg_loss_modes_by_hand():
    expected = {
        "token-mean": 10 / 4,  # Σ L·m / tokens
        "token-sum": 10.0,
        "seq-mean-token-sum": (6 + 4) / 2,  # mean over the non-empty sequences of Σ_t
        "seq-mean-token-mean": (2 + 4) / 2,
        "seq-mean-token-sum-norm": (6 + 4) / 2 / 3,  # seq-mean-token-sum / response_length (verl 0.9.1)
    }
    assert set(expected) == set(ca.LOSS_AGG_MODES)
    for mode, value in expected.items():
        assert ca.agg_loss(LOSS, MASK, mode).item() == pytest.approx(value)
    assert ca.agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=5).item() == pytest.approx(5 / 5)
    with pytest.raises(ValueError, match="token-sum") as err:
        ca.agg_loss(LOSS, MASK, "mean")
    assert all(mode in str(err.value) for mode in ca.LOSS_AGG_MODES)


def test_agg_loss_over_the_global_batch():
    # this batch is one of a mini-batch of 8 tokens and 4 sequences on 2 ranks: its share, × 2 ranks
    given = dict(dp_size=2, batch_num_tokens=8, global_batch_size=4)
    assert ca.agg_loss(LOSS, MASK, "token-mean", **given).item() == pytest.approx(10 / 8 * 2)
    assert ca.agg_loss(LOSS, MASK, "token-sum", **given).item() == pytest.approx(10 * 2)
    assert ca.agg_loss(LOSS, MASK, "seq-mean-token-mean", **given).item() == pytest.approx((2 + 4) / 4 * 2)
    loss, local = ca.aggregate(LOSS, MASK, "seq-mean-token-sum", global_batch=given)
    assert (loss.item(), local.item()) == pytest.approx(((6 + 4) / 4 * 2, (6 + 4) / 2))


# ----------------------------------------------------------------------------------------------- losses


def test_vanilla_dual_clip_cases():
    # One token per case: (advantage, ratio) -> per-token loss.
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0]])
    ratio = torch.tensor([[1.6, 0.5, 5.0, 0.5, 2.0]])
    logp = ratio.log().requires_grad_()
    loss, metrics = ca.compute_policy_loss(
        "vanilla", torch.zeros_like(ratio), logp, adv, torch.ones_like(ratio), "seq-mean-token-sum"
    )
    # A>0 ratio 1.6: clipped to 1.2 -> -1.2; A>0 ratio .5: unclipped -> -.5; A<0 ratio 5: max(5, 1.2)=5, dual
    # clip -> 3; A<0 ratio .5: clipped to .8 -> .8; A<0 ratio 2: max(2, 1.2)=2 < 3 -> 2.
    assert loss.item() == pytest.approx(-1.2 - 0.5 + 3.0 + 0.8 + 2.0)
    loss.backward()
    _close(logp.grad, [[0.0, -0.5, 0.0, 0.0, 2.0]])  # clipped and dual-clipped tokens carry no gradient
    assert metrics["actor/pg_clipfrac"].item() == pytest.approx(2 / 5)
    assert metrics["actor/pg_clipfrac_lower"].item() == pytest.approx(1 / 5)
    assert metrics["actor/ppo_kl"].item() == pytest.approx(-ratio.log().mean().item())
    assert metrics["actor/pg_loss"].item() == pytest.approx(loss.item()) and not metrics["actor/pg_loss"].requires_grad


def test_vanilla_ignores_masked_tokens_and_bad_args():
    old, logp = torch.zeros(1, 3), torch.tensor([[0.1, -0.1, 50.0]])  # the padded token's huge ratio must not matter
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, _ = ca.compute_policy_loss("vanilla", old, logp, torch.ones(1, 3), mask)
    assert loss.item() == pytest.approx(-(math.exp(0.1) + math.exp(-0.1)) / 2)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        pl.compute_policy_loss_vanilla(old, logp, torch.ones(1, 3), mask, clip_ratio_c=1.0)


def test_gspo_has_no_dual_clip_and_clamps_its_log_ratio():
    # A < 0 with the sequence ratio s = e^1.5: PPO's max(−A·s, −A·1.2) = e^1.5 — no dual clip at c = 3 (verl 0.9.1)
    old, mask = torch.zeros(1, 2), torch.ones(1, 2)
    loss, metrics = ca.compute_policy_loss("gspo", old, _logp([[1.0, 2.0]]), -torch.ones(1, 2), mask)
    assert loss.item() == pytest.approx(math.exp(1.5), rel=1e-5)
    assert metrics["actor/pg_clipfrac_lower"].item() == 0.0
    huge, _ = ca.compute_policy_loss("gspo", old, _logp([[12.0, 12.0]]), -torch.ones(1, 2), mask)
    assert huge.item() == pytest.approx(math.exp(10.0), rel=1e-5)  # log s clamped at 10


def test_gspo_uses_sequence_ratio_and_its_gradient():
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(2, 4, generator=gen) * 0.05
    logp = (old + torch.randn(2, 4, generator=gen) * 0.05).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0] * 4, [-0.5] * 4]) * mask
    config = _actor(clip_ratio_low=0.3, clip_ratio_high=0.3)
    loss, _ = ca.compute_policy_loss("gspo", old, logp, adv, mask, "seq-mean-token-mean", config=config)
    (grad,) = torch.autograd.grad(loss, logp)
    # Unclipped (ratios within 1 ± 0.3), GSPO equals the sequence objective −mean_i A_i·exp(mean_t(logp − old)).
    logp_ref = logp.detach().clone().requires_grad_()
    reference = -(adv[:, 0] * torch.exp(ca.masked_mean(logp_ref - old, mask, dim=-1))).mean()
    (grad_ref,) = torch.autograd.grad(reference, logp_ref)
    assert loss.item() == pytest.approx(reference.item(), abs=1e-6)
    _close(grad, grad_ref)
    assert torch.all(grad[mask == 0] == 0)


def test_sapo_gate_and_its_own_aggregation():
    # at ρ = 1: f = σ(0)·4/τ = 2/τ, so L = −2·A/τ; its gradient −A·σ'(0)·4·ρ = −A, PPO's at ρ = 1
    logp = _logp([[0.0, 0.0, 0.0]])
    adv, mask = torch.tensor([[1.0, -1.0, -1.0]]), torch.tensor([[1.0, 1.0, 0.0]])
    terms = pl.compute_policy_loss_sapo(torch.zeros(1, 3), logp, adv, mask, tau_pos=1.0, tau_neg=1.05)
    _close(terms.losses.detach()[:, :2], [[-2.0, 2 / 1.05]])
    (grad,) = torch.autograd.grad((terms.losses * mask).sum(), logp)
    _close(grad, [[-1.0, 1.0, 0.0]])
    # always seq-mean-token-mean, whatever loss_agg_mode says
    logp2, adv2, mask2 = (
        torch.zeros(2, 3),
        torch.tensor([[1.0] * 3, [-1.0] * 3]),
        torch.tensor([[1.0] * 3, [1.0, 0, 0]]),
    )
    loss, _ = ca.compute_policy_loss("sapo", logp2, logp2, adv2, mask2, "token-mean")
    assert loss.item() == pytest.approx((-2.0 + 2 / 1.05) / 2, rel=1e-5)  # token-mean: (3·−2 + 2/1.05) / 4


def test_cispo_keeps_the_gradient_of_clipped_tokens():
    # L = −sg[clip(ρ)]·A·log π: ρ = 1.5 -> 1.2 and ρ = 1.1 unclipped; both tokens get a gradient −clip(ρ)·A
    old = torch.log(torch.tensor([[0.2, 0.5]]))
    logp = _logp([[math.log(0.3), math.log(0.55)]])
    loss, metrics = ca.compute_policy_loss("cispo", old, logp, torch.ones(1, 2), torch.ones(1, 2), "token-sum")
    assert loss.item() == pytest.approx(-(1.2 * math.log(0.3) + 1.1 * math.log(0.55)), rel=1e-5)
    loss.backward()
    _close(logp.grad, [[-1.2, -1.1]])
    assert metrics["actor/pg_clipfrac"].item() == pytest.approx(0.5)


def test_gpg_is_the_plain_policy_gradient():
    logp, adv = _logp([[-1.0, -2.0]]), torch.tensor([[0.5, -1.0]])
    loss, metrics = ca.compute_policy_loss("gpg", torch.zeros(1, 2), logp, adv, torch.ones(1, 2), "token-sum")
    assert loss.item() == pytest.approx(-(-1.0 * 0.5 + -2.0 * -1.0))
    loss.backward()
    _close(logp.grad, -adv)
    assert set(metrics) == {"actor/pg_loss"}


def test_geo_mean_clips_in_log_space_per_sign():
    # r = (0.1, 0.5), ε = 0.2: A > 0 takes min(r, clip(r)) = (0.1, 0.2); A < 0 takes max(r, clip(r)) = (0.1, 0.5)
    old, mask = torch.zeros(2, 2), torch.ones(2, 2)
    logp = _logp([[0.1, 0.5], [0.1, 0.5]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    loss, metrics = ca.compute_policy_loss("geo_mean", old, logp, adv, mask, "token-sum")  # its own aggregation
    assert loss.item() == pytest.approx((-math.exp(0.15) + math.exp(0.3)) / 2, rel=1e-5)
    assert (metrics["actor/pg_clipfrac"].item(), metrics["actor/pg_clipfrac_lower"].item()) == (0.25, 0.25)
    loss.backward()  # d/dr_t of ½·(−e^{mean r̃}) for A > 0: the clipped token has none
    _close(logp.grad[0], [-0.5 * math.exp(0.15) / 2, 0.0])


def test_dppo_tv_masks_tokens_that_moved_too_far():
    # π_old = 0.5: π = 0.6 moved 0.1 ≤ 0.2 (kept), π = 0.8 moved 0.3 (dropped) for A > 0; π = 0.2 moved −0.3 for A < 0
    old = torch.log(torch.full((1, 3), 0.5))
    logp = _logp([[math.log(0.6), math.log(0.8), math.log(0.2)]])
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    loss, metrics = ca.compute_policy_loss("dppo_tv", old, logp, adv, torch.ones(1, 3), "token-sum")
    assert loss.item() == pytest.approx(-1.2 * math.log(0.6), rel=1e-5)  # −A·min(ρ, 3)·log π on the kept token
    loss.backward()
    _close(logp.grad, [[-1.2, 0.0, 0.0]])
    assert metrics["actor/pg_clipfrac"].item() == pytest.approx(2 / 3)
    _, truncated = ca.compute_policy_loss(
        "dppo_tv",
        old,
        torch.log(torch.tensor([[0.6, 0.6, 0.6]])),
        torch.ones(1, 3),
        torch.ones(1, 3),
        config=_actor(clip_ratio_c=1.1),
    )
    assert truncated["actor/pg_clipfrac_lower"].item() == 1.0  # ρ = 1.2 > c = 1.1


def test_dppo_kl_uses_the_binary_kl():
    # π_old = 0.5: D(0.7) = ½log(.5/.7) + ½log(.5/.3) ≈ 0.087 (kept), D(0.8) ≈ 0.223 > 0.2 (dropped)
    old = torch.log(torch.full((1, 2), 0.5))
    logp = torch.log(torch.tensor([[0.7, 0.8]]))
    terms = pl.compute_policy_loss_dppo_kl(old, logp, torch.ones(1, 2), torch.ones(1, 2))
    _close(terms.losses, [[-1.4 * math.log(0.7), 0.0]])
    # a probability moving against the advantage's direction is always kept
    down = pl.compute_policy_loss_dppo_kl(
        old, torch.log(torch.tensor([[0.05, 0.05]])), torch.ones(1, 2), torch.ones(1, 2)
    )
    assert down.metrics["actor/pg_clipfrac"].item() == 0.0


def test_dro_quadratic_penalty():
    old, logp, adv = torch.tensor([[-1.0]]), _logp([[-0.5]]), torch.tensor([[2.0]])
    loss, metrics = ca.compute_policy_loss("dro", old, logp, adv, torch.ones(1, 1), config=_actor(dro_beta=0.4))
    assert loss.item() == pytest.approx(-(-0.5 * 2.0 - 0.5 * 0.4 * 0.25))
    loss.backward()
    _close(logp.grad, [[-(2.0 - 0.4 * 0.5)]])
    assert metrics["actor/ppo_kl"].item() == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="dro_beta"):
        pl.compute_policy_loss_dro(old, logp, adv, torch.ones(1, 1))


def test_clip_cov_detaches_the_token_in_the_covariance_band():
    # ρ = 1 everywhere; cov_t = (A_t − mean A)(log π_t − mean log π): only token 0's lies in (1, 5), and
    # max(⌊0.0002·4⌋, 1) = 1 token is dropped: its loss and gradient are 0
    adv = torch.tensor([[3.0, 0.0, -1.0, -2.0]])
    logp = _logp([[-0.1, -1.0, -1.2, -1.3]])
    loss, metrics = ca.compute_policy_loss("clip_cov", logp.detach(), logp, adv, torch.ones(1, 4), "token-sum")
    assert loss.item() == pytest.approx(0.0 + 1.0 + 2.0)  # −A·ρ of the kept tokens
    loss.backward()
    _close(logp.grad, [[0.0, 0.0, 1.0, 2.0]])
    assert metrics["actor/pg_clipfrac"].item() == pytest.approx(0.25)


def test_kl_cov_penalises_the_highest_covariance_token():
    # the same tokens; the largest cov is token 0's, which gets + 0.1·|log π − log π_old|
    adv = torch.tensor([[3.0, 0.0, -1.0, -2.0]])
    old = torch.tensor([[-0.3, -1.0, -1.2, -1.3]])
    logp = _logp([[-0.1, -1.0, -1.2, -1.3]])
    loss, metrics = ca.compute_policy_loss("kl_cov", old, logp, adv, torch.ones(1, 4), "token-sum")
    assert loss.item() == pytest.approx(-3 * math.exp(0.2) + 0.1 * 0.2 + 1.0 + 2.0, rel=1e-5)
    assert metrics["actor/ppo_kl"].item() == pytest.approx(0.2 / 4)  # mean |log ratio|


# ----------------------------------------------------------------------------------------------- registry


def test_options_come_from_the_actor_config():
    config = _actor(clip_ratio=0.1, clip_ratio_low=None, clip_ratio_high=0.5, tau_neg=2.0, kl_cov_ratio=0.5)
    assert ca.policy_loss_options("vanilla", config) == {
        "clip_ratio_low": 0.1,
        "clip_ratio_high": 0.5,
        "clip_ratio_c": 3.0,
    }
    assert ca.policy_loss_options("sapo", config) == {"tau_pos": 1.0, "tau_neg": 2.0}
    assert ca.policy_loss_options("kl_cov", config) == {"kl_cov_ratio": 0.5, "ppo_kl_coef": 0.1}
    assert ActorConfig().clip_ratio_low == ActorConfig().clip_ratio_high == 0.2  # verl 0.9.1's defaults


def test_every_loss_is_registered_with_known_needs():
    assert list(ca.POLICY_LOSSES) == [
        "vanilla",
        "gspo",
        "sapo",
        "cispo",
        "gpg",
        "geo_mean",
        "dppo_tv",
        "dppo_kl",
        "dro",
        "clip_cov",
        "kl_cov",
        "bypass_mode",
    ]
    assert [n for n, entry in ca.POLICY_LOSSES.items() if entry.needs] == ["bypass_mode"]
    with pytest.raises(ValueError, match="cispo") as err:
        ca.compute_policy_loss("ppo", torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1))
    assert all(name in str(err.value) for name in ca.POLICY_LOSSES)
    with pytest.raises(ValueError, match="rollout_log_probs"):
        ca.compute_policy_loss("bypass_mode", torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1))


def test_value_loss_clipping():
    values = torch.zeros(1, 3)
    vpreds = torch.tensor([[1.0, 0.2, 7.0]])
    returns = torch.tensor([[1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics = ca.compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.5)
    # token 0: unclipped 0, clipped (0.5 − 1)² = .25 -> .25 (clipped wins); token 1: both .04.
    assert loss.item() == pytest.approx(0.5 * (0.25 + 0.04) / 2)
    assert metrics["critic/vf_clipfrac"].item() == pytest.approx(0.5)
    assert metrics["critic/vpred_mean"].item() == pytest.approx(0.6)
    assert metrics["critic/vf_loss"].item() == pytest.approx(loss.item())
    share, metrics = ca.compute_value_loss(
        vpreds, returns, values, mask, 0.5, global_batch=dict(dp_size=1, batch_num_tokens=4, global_batch_size=2)
    )
    assert share.item() == pytest.approx(0.5 * (0.25 + 0.04) / 4)  # its share of a 4-token mini-batch
    assert metrics["critic/vf_loss"].item() == pytest.approx(loss.item())
