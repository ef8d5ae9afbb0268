"""On-policy distillation losses (``algos.distillation``): each loss mode's value and gradient against a computation
from scratch, zero divergence when the teacher is the student, the two ways into the actor's loss, and verl 0.9.1's
own functions where they import."""

import os
from types import SimpleNamespace

import pytest
import torch

import algos.distillation as od
from algos.losses import agg_loss
from algos.policy_losses import compute_policy_loss_vanilla

torch.set_num_threads(1)
B, R, V = 3, 5, 11
MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.float32)
# d = log π(y) − log ν(y) of the sampled token: each estimator's value and its derivative in log π
FROM_SCRATCH = {
    "k1": (lambda d: d, lambda d: torch.ones_like(d)),
    "kl": (lambda d: d, lambda d: torch.ones_like(d)),
    "abs": (lambda d: d.abs(), lambda d: d.sign()),
    "k2": (lambda d: d**2 / 2, lambda d: d),
    "mse": (lambda d: d**2 / 2, lambda d: d),
    "k3": (lambda d: torch.exp(-d) + d - 1, lambda d: 1 - torch.exp(-d)),
    "low_var_kl": (lambda d: torch.exp(-d) + d - 1, lambda d: 1 - torch.exp(-d)),
}


def logits(seed: int, scale: float = 2.0) -> torch.Tensor:
    return torch.randn(B, R, V, generator=torch.Generator().manual_seed(seed)) * scale


def sampled(seed: int):
    """The log-probs of a sampled token under a student (with gradient) and a teacher, (B, R)."""
    gen = torch.Generator().manual_seed(seed)
    student = (torch.rand(B, R, generator=gen) * -3).requires_grad_()
    return student, torch.rand(B, R, generator=gen) * -3


@pytest.mark.parametrize("mode", sorted(FROM_SCRATCH))
def test_sampled_token_estimators_value_and_gradient(mode):
    student, teacher = sampled(0)
    losses, metrics = od.distillation_token_losses(mode, MASK, student_log_probs=student, teacher_log_probs=teacher)
    value, derivative = FROM_SCRATCH[mode]
    d = (student - teacher).detach()
    torch.testing.assert_close(losses, value(d))
    (losses * MASK).sum().backward()
    torch.testing.assert_close(student.grad, derivative(d) * MASK)
    assert metrics["distillation/abs_loss"].item() == pytest.approx(((value(d).abs() * MASK).sum() / MASK.sum()).item())


def test_top_k_forward_kl_over_the_whole_vocabulary_is_the_exact_forward_kl():
    student_logits, teacher_logits = logits(1).requires_grad_(), logits(2)
    teacher_log_probs = torch.log_softmax(teacher_logits, -1)
    ids = teacher_log_probs.topk(V, dim=-1).indices  # k = V: every token
    student_topk = od.topk_log_probs_from_logits(student_logits, ids)
    losses, metrics = od.forward_kl_topk(student_topk, teacher_log_probs.gather(-1, ids), MASK)
    exact = student_logits.detach().clone().requires_grad_()
    p = torch.softmax(teacher_logits, -1)  # Σ_v ν(v) (log ν(v) − log π(v)), written out
    reference = (p * (torch.log(p) - torch.log(torch.softmax(exact, -1)))).sum(-1)
    torch.testing.assert_close(losses, reference)
    (losses * MASK).sum().backward()
    (reference * MASK).sum().backward()
    torch.testing.assert_close(student_logits.grad, exact.grad)
    assert metrics["distillation/teacher_mass"].item() == pytest.approx(1.0)


def test_top_k_forward_kl_sums_over_the_teachers_k_tokens_with_the_clamp():
    student_logits, teacher_logits, k, floor = logits(3).requires_grad_(), logits(4, scale=6.0), 3, -4.0
    teacher_log_probs = torch.log_softmax(teacher_logits, -1)
    top = teacher_log_probs.topk(k, dim=-1)
    student_topk = od.topk_log_probs_from_logits(student_logits, top.indices)
    losses, metrics = od.forward_kl_topk(student_topk, top.values, MASK, log_prob_min_clamp=floor)
    expected = torch.zeros(B, R)
    student_log_probs = torch.log_softmax(student_logits.detach(), -1)
    for b in range(B):
        for t in range(R):
            for j in range(k):
                v = top.indices[b, t, j]
                log_p = max(teacher_log_probs[b, t, v].item(), floor)
                log_q = max(student_log_probs[b, t, v].item(), floor)
                expected[b, t] += torch.exp(torch.tensor(log_p)) * (log_p - log_q)
    torch.testing.assert_close(losses, expected.clamp_min(0.0))
    student_mass = torch.exp(student_log_probs.gather(-1, top.indices)).sum(-1)
    assert metrics["distillation/student_mass"].item() == pytest.approx(
        ((student_mass * MASK).sum() / MASK.sum()).item()
    )
    assert 0 < metrics["distillation/teacher_mass_min"] <= metrics["distillation/teacher_mass_max"] <= 1


@pytest.mark.parametrize("mode", [*sorted(FROM_SCRATCH), "forward_kl_topk"])
def test_a_teacher_that_is_the_student_gives_zero_divergence(mode):
    student_logits = logits(5).requires_grad_()
    log_probs = torch.log_softmax(student_logits, -1)
    tokens = torch.randint(V, (B, R, 1), generator=torch.Generator().manual_seed(6))
    ids = log_probs.detach().topk(4, dim=-1).indices
    losses, _ = od.distillation_token_losses(
        mode,
        MASK,
        student_log_probs=log_probs.gather(-1, tokens).squeeze(-1),
        teacher_log_probs=log_probs.detach().gather(-1, tokens).squeeze(-1),
        student_topk_log_probs=od.topk_log_probs_from_logits(student_logits, ids),
        teacher_topk_log_probs=log_probs.detach().gather(-1, ids),
    )
    assert torch.count_nonzero(losses) == 0


def config(**overrides):
    base = dict(loss_max_clamp=None, use_policy_gradient=False, clip_ratio_low=0.2, clip_ratio_high=0.28)
    return SimpleNamespace(**{**base, **overrides})


def test_supervised_distillation_aggregates_the_clamped_losses():
    student, teacher = sampled(7)
    losses, _ = od.distillation_token_losses("k3", MASK, student_log_probs=student, teacher_log_probs=teacher)
    loss, metrics = od.distillation_loss(losses, MASK, config(loss_max_clamp=0.3), "seq-mean-token-mean")
    torch.testing.assert_close(loss, agg_loss(losses.clamp(-0.3, 0.3), MASK, "seq-mean-token-mean"))
    assert metrics["distillation/loss_max"] == losses[MASK.bool()].max()  # before the clamp
    loss.backward()
    assert student.grad is not None and student.grad.abs().sum() > 0


def test_policy_gradient_distillation_is_ppo_with_the_negative_divergence_as_advantage():
    student, teacher = sampled(8)
    old = student.detach() + 0.1 * torch.randn(B, R, generator=torch.Generator().manual_seed(9))
    losses, _ = od.distillation_token_losses("k1", MASK, student_log_probs=student, teacher_log_probs=teacher)
    loss, metrics = od.distillation_loss(
        losses, MASK, config(use_policy_gradient=True), log_prob=student, old_log_prob=old
    )
    terms = compute_policy_loss_vanilla(old, student, -(student - teacher).detach(), MASK, 0.2, 0.28)
    torch.testing.assert_close(loss, agg_loss(terms.losses, MASK, "token-mean"))
    assert {"distillation/pg_clipfrac", "distillation/ppo_kl", "distillation/pg_loss"} <= set(metrics)
    task = torch.tensor(2.0)
    both = SimpleNamespace(use_task_rewards=True, distillation_loss_coef=0.5)
    assert od.combine_with_policy_loss(task, loss, both) == task + 0.5 * loss
    alone = SimpleNamespace(use_task_rewards=False, distillation_loss_coef=0.5)
    assert od.combine_with_policy_loss(task, loss, alone) is loss


# ------------------------------------------------------------------------------------------- verl 0.9.1's own code

_environ = set(os.environ)
verl_found = pytest.importorskip("verl", reason="verl is not installed (make setup installs verl==0.9.1)")
from verl.trainer.distillation.fsdp import losses as verl_fsdp  # noqa: E402
from verl.trainer.ppo import core_algos as verl_algos  # noqa: E402
from verl.workers.config import DistillationConfig as VerlDistillationConfig  # noqa: E402
from verl.workers.config import DistillationLossConfig as VerlLossConfig  # noqa: E402

for _name in set(os.environ) - _environ:  # importing verl sets defaults for Ray; later tests must not see them
    del os.environ[_name]


@pytest.mark.parametrize("mode", sorted(FROM_SCRATCH))
def test_estimators_match_verl(mode):
    student, teacher = sampled(10)
    ours, _ = od.distillation_token_losses(mode, MASK, student_log_probs=student, teacher_log_probs=teacher)
    torch.testing.assert_close(ours, verl_algos.kl_penalty(student, teacher, mode))


@pytest.mark.parametrize("floor", [None, -3.0])
def test_top_k_forward_kl_matches_verl(floor):
    student_logits, teacher_logits, k = logits(11), logits(12, scale=5.0), 4
    top = torch.log_softmax(teacher_logits, -1).topk(k, dim=-1)
    flat = (B * R, k)
    loss_config = VerlLossConfig(
        loss_mode="forward_kl_topk", topk=k, log_prob_min_clamp=floor, use_policy_gradient=False
    )
    out = verl_fsdp.compute_forward_kl_topk(
        student_logits=student_logits.reshape(1, B * R, V),
        teacher_topk_log_probs=torch.nested.nested_tensor([top.values.reshape(flat)], layout=torch.jagged),
        teacher_topk_ids=torch.nested.nested_tensor([top.indices.reshape(flat)], layout=torch.jagged),
        config=VerlDistillationConfig(distillation_loss=loss_config),
        data_format="thd",
    )
    student_topk = od.topk_log_probs_from_logits(student_logits, top.indices)
    ours, metrics = od.forward_kl_topk(student_topk, top.values, torch.ones(B, R), log_prob_min_clamp=floor)
    torch.testing.assert_close(ours, out["distillation_losses"].reshape(B, R).clamp_min(0.0))  # verl clamps later
    assert metrics["distillation/student_mass"].item() == pytest.approx(out["student_mass"].mean().item(), rel=1e-5)


def test_policy_gradient_path_matches_verls_policy_loss():
    student, teacher = sampled(13)
    old = student.detach() + 0.2 * torch.randn(B, R, generator=torch.Generator().manual_seed(14))
    verl_config = VerlLossConfig(loss_mode="k1", use_policy_gradient=True, clip_ratio_low=0.2, clip_ratio_high=0.28)
    losses, _ = od.distillation_token_losses("k1", MASK, student_log_probs=student, teacher_log_probs=teacher)
    ours, _ = od.distillation_loss(losses, MASK, config(use_policy_gradient=True), log_prob=student, old_log_prob=old)
    theirs, _ = verl_algos.get_policy_loss_fn("vanilla")(
        old_log_prob=old,
        log_prob=student,
        advantages=-verl_algos.kl_penalty(student, teacher, "k1").detach(),
        response_mask=MASK,
        loss_agg_mode="token-mean",
        config=verl_config,
    )
    torch.testing.assert_close(ours, theirs)
