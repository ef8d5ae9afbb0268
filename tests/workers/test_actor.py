"""The PPO actor on a plain (single-process) model: log-probs, the update, and its guard rails."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch._dynamo.utils import counters
from transformers import AutoModelForCausalLM

from algos import entropy_from_logits
from tests.workers.helpers import actor_config, make_update_batch
from workers.compute.actor import DataParallelPPOActor
from workers.parallel.optim import build_optimizer
from workers.roles.role import TrainedRole

P, R = 6, 5


def _actor(model_dir, **cfg):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = actor_config(**cfg)
    return DataParallelPPOActor(model, build_optimizer(model, config.optim), None, config)


def _params(module):
    return {k: v.detach().clone() for k, v in module.named_parameters()}


@pytest.mark.parametrize("fused", [True, False])
def test_log_probs_match_a_direct_full_model_computation(tiny_model_dir, fused):
    actor = _actor(tiny_model_dir)
    actor.use_fused_kernels = fused
    data = make_update_batch(6, P, R)
    b = data.batch
    valid = b["response_mask"].bool()
    with torch.no_grad():
        logits = actor.module(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
        ).logits
        logits = logits[:, P - 1 : -1] / 0.7  # position t predicts token t+1
        direct = torch.log_softmax(logits, -1).gather(-1, b["responses"][..., None]).squeeze(-1)
        log_probs, entropy = actor.forward_log_prob(
            b["input_ids"], b["attention_mask"], b["position_ids"], R, temperature=0.7, calculate_entropy=True
        )
    assert not valid.all()  # some responses end early: their padding is 0, not a log-prob
    torch.testing.assert_close(log_probs, torch.where(valid, direct, 0.0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, torch.where(valid, entropy_from_logits(logits), 0.0), rtol=1e-5, atol=1e-5)
    # micro-batching (4 + 2 rows) gives the same numbers
    chunked, chunked_entropy = actor.compute_log_prob(data, micro_batch_size=4, temperature=0.7, calculate_entropy=True)
    torch.testing.assert_close(chunked, log_probs, rtol=1e-5, atol=1e-5)
    assert chunked_entropy.shape == (6, R)


@pytest.mark.parametrize("use_kl_loss", [False, True])
def test_update_changes_weights_and_reports_finite_metrics(tiny_model_dir, use_kl_loss):
    actor = _actor(tiny_model_dir, use_kl_loss=use_kl_loss, entropy_coeff=0.01, ppo_epochs=2)
    before = _params(actor.module)
    metrics = actor.update_policy(make_update_batch(8, P, R))
    after = _params(actor.module)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    expected = {
        "actor/pg_loss",
        "actor/pg_clipfrac",
        "actor/ppo_kl",
        "actor/pg_clipfrac_lower",
        "actor/entropy",
        "actor/grad_norm",
        "actor/lr",
    } | ({"actor/kl_loss"} if use_kl_loss else set())
    assert expected <= set(metrics)
    assert len(metrics["actor/grad_norm"]) == 2 * 2  # 2 epochs × 8/4 mini-batches
    assert len(metrics["actor/pg_loss"]) == 2 * 4  # ... × 4/2 micro-batches
    assert all(math.isfinite(v) for values in metrics.values() for v in values)
    assert 0 < metrics["actor/pg_clipfrac"][0] < 1  # old_log_probs are off-policy, so some tokens clip


def _full_kl_actor(model_dir, ref_noise: float, **cfg):
    """An actor with kl_loss_type=full whose reference is its own copy, perturbed by ``ref_noise``."""
    ref = AutoModelForCausalLM.from_pretrained(model_dir).requires_grad_(False)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(ref_noise * torch.randn_like(p))
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = actor_config(use_kl_loss=True, kl_loss_type="full", **cfg)
    return DataParallelPPOActor(model, build_optimizer(model, config.optim), None, config, ref_module=ref)


def test_full_kl_loss_is_zero_against_itself_and_pulls_towards_the_reference(tiny_model_dir):
    same = _full_kl_actor(tiny_model_dir, ref_noise=0.0)
    data = make_update_batch(8, P, R)
    del data.batch["ref_log_prob"]  # the exact KL reads the reference logits instead
    assert abs(same.update_policy(data)["actor/kl_loss"][0]) < 1e-6
    # no policy gradient (zero advantages), only the KL: it falls step after step
    torch.manual_seed(1)
    far = _full_kl_actor(
        tiny_model_dir, ref_noise=0.1, kl_loss_coef=1.0, ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=8
    )
    data.batch["advantages"] = torch.zeros_like(data.batch["advantages"])
    kls = [far.update_policy(data)["actor/kl_loss"][0] for _ in range(5)]
    assert kls[0] > 1e-3 and all(b < a for a, b in zip(kls, kls[1:])), kls


def test_full_kl_loss_without_a_reference_model_is_rejected(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    config = actor_config(use_kl_loss=True, kl_loss_type="full")
    with pytest.raises(ValueError, match="kl_loss_type=full"):
        DataParallelPPOActor(model, build_optimizer(model, config.optim), None, config)


def test_on_policy_update_without_old_log_probs_equals_recomputing_them(tiny_model_dir):
    """One optimizer step per batch: the update's own detached log-probs are the old ones (no extra forward)."""
    data = make_update_batch(8, P, R)
    recomputed = _actor(tiny_model_dir, ppo_mini_batch_size=8)
    data.batch["old_log_probs"], _ = recomputed.compute_log_prob(data, micro_batch_size=8)
    want = recomputed.update_policy(data)
    skipped = _actor(tiny_model_dir, ppo_mini_batch_size=8)
    del data.batch["old_log_probs"]
    got = skipped.update_policy(data)
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6)
    assert got["actor/ppo_kl"] == [0.0] * len(got["actor/ppo_kl"])
    for name, param in skipped.module.named_parameters():
        torch.testing.assert_close(param, dict(recomputed.module.named_parameters())[name], rtol=1e-5, atol=1e-6)
    # a second optimizer step on the batch would be off-policy: then old_log_probs are required
    with pytest.raises(ValueError, match="ppo_epochs=2"):
        _actor(tiny_model_dir, ppo_mini_batch_size=8, ppo_epochs=2).update_policy(data)


def test_positive_advantage_raises_the_response_log_prob(tiny_model_dir):
    actor = _actor(tiny_model_dir, ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=8)
    data = make_update_batch(8, P, R)
    mask = data.batch["response_mask"].float()
    before, _ = actor.compute_log_prob(data, micro_batch_size=8)
    data.batch["old_log_probs"] = before
    data.batch["advantages"] = mask.clone()
    actor.update_policy(data)
    after, _ = actor.compute_log_prob(data, micro_batch_size=8)
    assert ((after - before) * mask).sum() > 0


def test_non_finite_gradient_skips_the_step(tiny_model_dir):
    actor = _actor(tiny_model_dir, ppo_mini_batch_size=8)
    data = make_update_batch(8, P, R)
    data.batch["advantages"] = torch.full_like(data.batch["advantages"], float("nan"))
    before = _params(actor.module)
    metrics = actor.update_policy(data)
    assert not math.isfinite(metrics["actor/grad_norm"][0])
    assert all(torch.equal(before[k], v) for k, v in _params(actor.module).items())
    assert all(p.grad is None for p in actor.module.parameters())


def _role_actor(model_dir, compile: bool, **cfg):
    """An actor on the module a worker's ``TrainedRole`` builds (one rank: no FSDP)."""
    torch.manual_seed(0)
    config = actor_config(**cfg)
    where = SimpleNamespace(device=torch.device("cpu"), world_size=1)
    role = TrainedRole(
        where, AutoModelForCausalLM.from_pretrained(model_dir), config.fsdp_config, config.optim, 10, compile=compile
    )
    return DataParallelPPOActor(role.module, role.optimizer, None, config)


@pytest.mark.slow  # torch.compile of a whole policy: ~35 s
def test_compiled_policy_matches_eager(tiny_model_dir):
    """``use_torch_compile``: the worker compiles the policy in place; log-probs and the update agree with eager."""
    data = make_update_batch(8, P, R)
    eager = _role_actor(tiny_model_dir, False, ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=8)
    compiled = _role_actor(tiny_model_dir, True, ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=8)
    torch._dynamo.reset()
    counters.clear()
    want, _ = eager.compute_log_prob(data, micro_batch_size=8)
    assert counters["stats"]["unique_graphs"] == 0  # eager ran no compiler
    got, _ = compiled.compute_log_prob(data, micro_batch_size=8)
    assert counters["stats"]["unique_graphs"] > 0  # the forward was captured and compiled
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    eager_metrics, compiled_metrics = eager.update_policy(data), compiled.update_policy(data)
    torch.testing.assert_close(compiled_metrics["actor/grad_norm"], eager_metrics["actor/grad_norm"], rtol=1e-4, atol=0)
    for name, param in compiled.module.named_parameters():
        torch.testing.assert_close(param, dict(eager.module.named_parameters())[name], rtol=1e-4, atol=1e-5)
