"""The value model and critic updates (plain model), and the AdamW + warm-up schedule."""

import math

import pytest
import torch

from config.sections import OptimConfig
from tests.workers.helpers import critic_config, make_update_batch
from workers.compute.critic import DataParallelPPOCritic, load_value_model
from workers.parallel.optim import build_lr_scheduler, build_optimizer

P, R = 6, 5


def _critic(model_dir, **cfg):
    torch.manual_seed(0)
    model = load_value_model(model_dir)
    config = critic_config(model_dir, **cfg)
    return DataParallelPPOCritic(model, build_optimizer(model, config.optim), None, config)


def test_values_start_at_zero_with_response_shape(tiny_model_dir):
    critic = _critic(tiny_model_dir)
    data = make_update_batch(7, P, R)
    values = critic.compute_values(data)
    assert values.shape == (7, R)
    assert torch.count_nonzero(values) == 0  # zero-initialised head


def test_values_are_masked_and_read_before_each_response_token(tiny_model_dir):
    critic = _critic(tiny_model_dir)
    with torch.no_grad():
        critic.module.score.weight.normal_()
    data = make_update_batch(7, P, R)
    b = data.batch
    values = critic.compute_values(data)
    with torch.no_grad():
        full = critic.module(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
        ).logits[..., 0]
    torch.testing.assert_close(values, full[:, P - 1 : -1] * b["response_mask"], rtol=1e-5, atol=1e-5)
    assert (values[b["response_mask"] == 0] == 0).all()


def test_value_loss_falls_on_a_fixed_batch(tiny_model_dir):
    critic = _critic(tiny_model_dir, cliprange_value=100.0)
    data = make_update_batch(8, P, R)
    data.batch["returns"] = torch.randn(8, R, generator=torch.Generator().manual_seed(1)) * data.batch["response_mask"]
    losses = []
    for _ in range(6):
        data.batch["values"] = critic.compute_values(data)
        metrics = critic.update_critic(data)
        losses.append(sum(metrics["critic/vf_loss"]) / len(metrics["critic/vf_loss"]))
    expected = {"critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm", "critic/lr"}
    assert expected <= set(metrics)
    assert all(math.isfinite(v) for values in metrics.values() for v in values)
    assert losses[-1] < 0.7 * losses[0]


@pytest.mark.parametrize(
    ("optim", "total", "expected"),
    [
        (OptimConfig(lr=1.0, lr_warmup_steps=4), 100, [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]),  # verl's: from step 0
        (OptimConfig(lr=1.0, lr_warmup_steps=4, zero_indexed_step=False), 100, [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]),
        (OptimConfig(lr=1.0, lr_warmup_steps_ratio=0.2, zero_indexed_step=False), 10, [0.5, 1.0, 1.0]),
        (OptimConfig(lr=1.0), 10, [1.0, 1.0]),
    ],
)
def test_linear_warmup_then_constant(optim, total, expected):
    model = torch.nn.Linear(2, 1)
    optimizer = build_optimizer(model, optim)
    scheduler = build_lr_scheduler(optimizer, optim, total)
    seen = []
    for _ in expected:
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx(expected)


def test_optimizer_reads_betas_and_weight_decay():
    optim = OptimConfig(lr=0.5, betas=[0.8, 0.95], weight_decay=0.1)
    group = build_optimizer(torch.nn.Linear(2, 1), optim).param_groups[0]
    assert (group["lr"], group["betas"], group["weight_decay"]) == (0.5, (0.8, 0.95), 0.1)


def test_optimizer_is_fused_on_cpu_and_updates_as_the_looped_adamw():
    optim = OptimConfig(lr=0.1, betas=[0.9, 0.99], weight_decay=0.01)
    ours, looped = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    looped.load_state_dict(ours.state_dict())
    fused = build_optimizer(ours, optim)
    plain = torch.optim.AdamW(looped.parameters(), lr=0.1, betas=(0.9, 0.99), weight_decay=0.01, foreach=False)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    for model, optimizer in ((ours, fused), (looped, plain)):
        for _ in range(3):
            optimizer.zero_grad()
            model(x).pow(2).sum().backward()
            optimizer.step()
    assert fused.param_groups[0]["fused"]
    for a, b in zip(ours.parameters(), looped.parameters()):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "warmup, floor, cycles, zero", [(0, 0.0, 0.5, True), (3, 0.1, 0.5, True), (2, 0.2, 1.0, False)]
)
def test_cosine_schedule_is_verls(warmup, floor, cycles, zero):
    """lr_scheduler_type=cosine follows verl's schedule step for step (its function, imported in this test only)."""
    from verl.utils.torch_functional import get_cosine_schedule_with_warmup

    total = 12
    optim = OptimConfig(
        lr=1.0, lr_warmup_steps=warmup, lr_scheduler_type="cosine", min_lr_ratio=floor, num_cycles=cycles,
        zero_indexed_step=zero,
    )  # fmt: skip
    ours = build_lr_scheduler(build_optimizer(torch.nn.Linear(2, 1), optim), optim, total)
    theirs_opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=1.0)
    theirs = get_cosine_schedule_with_warmup(theirs_opt, warmup, total, floor, cycles, zero_indexed_step=zero)
    for _ in range(total):
        assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr())
        ours.optimizer.step(), ours.step(), theirs_opt.step(), theirs.step()


def test_other_optimizers_are_built_as_verl_builds_them():
    optim = OptimConfig(lr=0.5, optimizer="SGD", override_optimizer_config={"momentum": 0.9})
    built = build_optimizer(torch.nn.Linear(2, 1), optim)
    assert isinstance(built, torch.optim.SGD) and built.param_groups[0]["momentum"] == 0.9
    assert "betas" not in built.param_groups[0]  # only Adam-like optimizers take betas (verl's rule)
