"""The distillation teacher on one process: its scores over micro-batches, the actor's loss with distillation against a
from-scratch computation (value and gradient), rows routed among several teachers, and offload on CUDA."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from algos.distillation import topk_log_probs_from_logits
from algos.kl import kl_penalty
from config.distillation import DistillationConfig, DistillationLossConfig, teacher_fsdp_config
from config.sections import ActorRolloutRefConfig
from tests.workers.helpers import VOCAB, actor_config, build_tiny_checkpoint, make_update_batch
from workers.compute.actor import DataParallelPPOActor
from workers.compute.packing import mini_batch_totals
from workers.compute.teacher import merge_by_rows, route_rows, score_batch
from workers.parallel.optim import build_optimizer
from workers.roles.role import FrozenRole

P, R, ROWS = 6, 5, 6


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory) -> str:
    """Another tiny Llama of the same vocabulary: a teacher that differs from the student."""
    return build_tiny_checkpoint(tmp_path_factory.mktemp("teacher"), hidden=48, seed=1)


def _model(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _full_log_softmax(model, batch, temperature=1.0):
    """(B, R, V) log-softmax of the full logits at the positions that predict each response token."""
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).logits
    return torch.log_softmax(logits[:, P - 1 : -1].float() / temperature, dim=-1)


@pytest.mark.parametrize("remove_padding", [False, True], ids=["padded", "remove-padding"])
def test_scores_over_micro_batches_equal_one_forward(teacher_dir, remove_padding):
    """Micro-batches of 4 + 2 rows or of a token budget give each row its own scores, in row order."""
    teacher, data = _model(teacher_dir), make_update_batch(ROWS, P, R)
    whole = score_batch(teacher, data, ROWS, None, remove_padding, True, topk=3)
    assert set(whole) == {"teacher_topk_ids", "teacher_topk_log_probs"}
    assert whole["teacher_topk_ids"].dtype == torch.int64 and whole["teacher_topk_log_probs"].shape == (ROWS, R, 3)
    for micro, budget in ((4, None), (1, 2 * (P + R))):
        part = score_batch(teacher, data, micro, budget, remove_padding, True, topk=3)
        assert torch.equal(part["teacher_topk_ids"], whole["teacher_topk_ids"])
        torch.testing.assert_close(part["teacher_topk_log_probs"], whole["teacher_topk_log_probs"])
    sampled = score_batch(teacher, data, 4, None, remove_padding, False, topk=None)
    with torch.no_grad():
        full = _full_log_softmax(teacher, data.batch).gather(-1, data.batch["responses"][..., None]).squeeze(-1)
    torch.testing.assert_close(sampled["teacher_log_probs"], full * data.batch["response_mask"], rtol=1e-5, atol=1e-5)


def test_rows_that_repeat_a_prompt_may_run_it_once(teacher_dir):
    """With the actor's prefix grouper (remove-padding), a group's prompt runs once: the same scores."""
    teacher, data = _model(teacher_dir), make_update_batch(ROWS, P, R)
    for key in ("input_ids", "attention_mask", "position_ids"):  # rows 0-2 repeat row 0's prompt
        data.batch[key][1:3, :P] = data.batch[key][0, :P]
    alone = score_batch(teacher, data, ROWS, None, True, True, topk=3)
    shared = score_batch(teacher, data, ROWS, None, True, True, topk=3, share_prompts=True)
    assert torch.equal(alone["teacher_topk_ids"], shared["teacher_topk_ids"])
    torch.testing.assert_close(alone["teacher_topk_log_probs"], shared["teacher_topk_log_probs"], rtol=1e-5, atol=1e-5)


def _distilling_actor(student_dir, **loss):
    torch.manual_seed(0)
    model = _model(student_dir)
    config = actor_config(ppo_micro_batch_size_per_gpu=ROWS)
    distillation = DistillationConfig(distillation_loss=DistillationLossConfig(**loss))
    return DataParallelPPOActor(model, build_optimizer(model, config.optim), None, config, distillation=distillation)


def _loss_and_grads(actor, micro, temperature):
    actor.module.zero_grad(set_to_none=True)
    totals = mini_batch_totals(micro["response_mask"]).global_batch()
    loss, metrics = actor._micro_loss(micro, temperature, totals)
    loss.backward()
    return loss.detach(), metrics, {n: p.grad.clone() for n, p in actor.module.named_parameters()}


@pytest.mark.parametrize("loss_mode", ["k3", "forward_kl_topk"])
@pytest.mark.parametrize("use_task_rewards", [False, True], ids=["alone", "with-task"])
def test_the_actors_loss_with_distillation_equals_a_from_scratch_computation(
    tiny_model_dir, teacher_dir, loss_mode, use_task_rewards
):
    """The actor's micro-batch loss and its gradient: the token-mean divergence to the teacher's scores (the
    student at the rollout's temperature, the teacher at 1), alone or + 0.5 × it beside the policy loss."""
    loss = dict(loss_mode=loss_mode, topk=4, use_task_rewards=use_task_rewards, distillation_loss_coef=0.5)
    actor = _distilling_actor(tiny_model_dir, **loss)
    data = make_update_batch(ROWS, P, R)
    scores = score_batch(_model(teacher_dir), data, ROWS, None, False, True, topk=4 if loss_mode != "k3" else None)
    micro = {**data.batch, **scores}
    mask = micro["response_mask"].float()
    got, metrics, got_grads = _loss_and_grads(actor, micro, 0.7)

    plain = _distilling_actor(tiny_model_dir)
    plain.distillation = None  # the same actor's task loss alone
    task, _, _ = _loss_and_grads(plain, micro, 0.7)
    actor.module.zero_grad(set_to_none=True)
    student = _full_log_softmax(actor.module, micro, 0.7)
    if loss_mode == "k3":
        sampled = student.gather(-1, micro["responses"][..., None]).squeeze(-1)
        tokens = kl_penalty(sampled, micro["teacher_log_probs"], "k3")
    else:
        teacher = micro["teacher_topk_log_probs"]
        own = topk_log_probs_from_logits(student, micro["teacher_topk_ids"])
        tokens = (teacher.exp() * (teacher - own)).sum(-1).clamp_min(0)
    divergence = (tokens * mask).sum() / mask.sum()
    coef = 0.5 if use_task_rewards else 1.0  # distillation_loss_coef applies beside the task's loss only
    (coef * divergence).backward()
    want_grads = {n: p.grad for n, p in actor.module.named_parameters()}
    if use_task_rewards:  # the policy loss's gradient is the plain actor's: compare the distillation's share
        _, _, task_grads = _loss_and_grads(plain, micro, 0.7)
        want_grads = {n: g + task_grads[n] for n, g in want_grads.items()}
    torch.testing.assert_close(
        got, (task if use_task_rewards else 0) + coef * divergence.detach(), rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(metrics["distillation/loss"], divergence.detach(), rtol=1e-5, atol=1e-6)
    for name, grad in got_grads.items():
        torch.testing.assert_close(grad, want_grads[name], rtol=1e-3, atol=1e-5)


def test_a_teacher_equal_to_the_student_gives_the_top_k_loss_no_gradient(tiny_model_dir):
    """With k = the whole vocabulary the truncated forward KL is the exact one: 0, and so is its gradient (a
    smaller k leaves the mass outside the top-k, whose gradient does not vanish)."""
    actor = _distilling_actor(tiny_model_dir, loss_mode="forward_kl_topk", topk=VOCAB, use_task_rewards=False)
    data = make_update_batch(ROWS, P, R)
    scores = score_batch(actor.module, data, ROWS, None, False, True, topk=VOCAB)
    loss, metrics, grads = _loss_and_grads(actor, {**data.batch, **scores}, 1.0)
    assert abs(loss) < 1e-6 and metrics["distillation/teacher_mass"] == pytest.approx(1.0)
    assert max(g.abs().max() for g in grads.values()) < 1e-5


def test_rows_go_to_the_teacher_of_their_key():
    rows = route_rows({"math": "gsm8k", "code": "mbpp"}, np.array(["mbpp", "gsm8k", "mbpp"], dtype=object), "key")
    assert rows["math"].tolist() == [False, True, False] and rows["code"].tolist() == [True, False, True]
    scores = {name: {"teacher_log_probs": torch.full((3, 2), value)} for name, value in (("math", 1.0), ("code", 2.0))}
    assert merge_by_rows(scores, rows)["teacher_log_probs"][:, 0].tolist() == [2.0, 1.0, 2.0]
    with pytest.raises(ValueError, match=r"rows with key=\['webqa'\] have no teacher"):
        route_rows({"math": "gsm8k"}, np.array(["webqa", "gsm8k"], dtype=object), "key")


@pytest.mark.gpu
def test_on_cuda_a_teacher_waits_in_host_memory_between_its_forwards(teacher_dir):
    """Offloaded (``teacher_fsdp_config``): its parameters are on the GPU only inside ``onloaded``, and the
    allocator gives their memory back afterwards."""
    worker = SimpleNamespace(device=torch.device("cuda"), world_size=1)
    fsdp_config = teacher_fsdp_config(ActorRolloutRefConfig())
    assert fsdp_config.param_offload
    before = torch.cuda.memory_allocated()
    teacher = FrozenRole(worker, _model(teacher_dir), fsdp_config)
    assert {p.device.type for p in teacher.module.parameters()} == {"cpu"}
    assert torch.cuda.memory_allocated() == before
    data = make_update_batch(ROWS, P, R)
    with teacher.onloaded():
        assert {p.device.type for p in teacher.module.parameters()} == {"cuda"}
        scores = score_batch(teacher.module, data, ROWS, None, False, True, topk=4)
    assert {p.device.type for p in teacher.module.parameters()} == {"cpu"}
    assert torch.cuda.memory_allocated() == before and scores["teacher_topk_ids"].device.type == "cpu"
