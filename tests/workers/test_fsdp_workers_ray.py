"""The role workers through the real Ray path: two CPU ranks, actor/rollout/ref and critic colocated.

One module-scoped group walks a PPO step in order (generate, log-probs, ref, values, updates), as the
trainer does.
"""

import math

import pytest
import torch

from config.sections import ActorRolloutRefConfig, ModelConfig, RefConfig, RolloutConfig
from single_controller import (
    DataProto,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
)
from tests.workers.helpers import actor_config, critic_config, make_prompts, worker_config
from workers.roles.fsdp_workers import ActorRolloutRefWorker
from workers.roles.scoring_workers import CriticWorker

P, R, N, PROMPTS = 6, 5, 2, 4  # 4 prompts × n=2 = 8 rows, 4 per rank

pytestmark = [pytest.mark.usefixtures("ray_cluster"), pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def groups(tiny_model_dir):
    arr = ActorRolloutRefConfig(
        model=ModelConfig(path=tiny_model_dir),
        actor=actor_config(ppo_mini_batch_size=PROMPTS),  # ×n / 2 ranks = 4 rows per rank, micro 2
        rollout=RolloutConfig(
            n=N, prompt_length=P, response_length=R, log_prob_micro_batch_size_per_gpu=3, calculate_log_probs=True
        ),
        ref=RefConfig(log_prob_micro_batch_size_per_gpu=3),
    )
    critic = critic_config(tiny_model_dir, ppo_mini_batch_size=PROMPTS, rollout_n=N)
    cfg, plan = worker_config(arr, critic, n_workers=2, prompts=PROMPTS)
    roles = {
        "actor_rollout_ref": RayClassWithInitArgs(
            ActorRolloutRefWorker, config=cfg.actor_rollout_ref, role="actor_rollout_ref", plan=plan
        ),
        "critic": RayClassWithInitArgs(CriticWorker, config=cfg.critic, plan=plan),
    }
    group = RayWorkerGroup(RayResourcePool([2], use_gpu=False), create_colocated_worker_cls(roles))
    views = group.spawn(prefix_set=list(roles))
    views["critic"].init_model(total_training_steps=3)
    views["actor_rollout_ref"].init_model(total_training_steps=3)
    return views


def _prompts(**meta) -> DataProto:
    ids, mask, pos = make_prompts(PROMPTS, P)
    data = DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos}, meta_info=meta)
    return data.repeat(N, interleave=True)


def test_ppo_step_through_ray(groups):
    actor, critic = groups["actor_rollout_ref"], groups["critic"]
    gen = actor.generate_sequences(_prompts())
    assert gen.batch["responses"].shape == (PROMPTS * N, R)
    assert gen.batch["input_ids"].shape == (PROMPTS * N, P + R)
    assert torch.equal(gen.batch["attention_mask"][:, P:], gen.batch["response_mask"])

    old = actor.compute_log_prob(gen)
    ref = actor.compute_ref_log_prob(gen)
    # the rollout's log-probs of its own samples, on 2 FSDP ranks, are the old log-probs a forward recomputes
    torch.testing.assert_close(gen.batch.pop("rollout_log_probs"), old.batch["old_log_probs"], rtol=0, atol=1e-5)
    values = critic.compute_values(gen)
    assert set(old.batch.keys()) == {"old_log_probs"} and set(ref.batch.keys()) == {"ref_log_prob"}
    torch.testing.assert_close(old.batch["old_log_probs"], ref.batch["ref_log_prob"])  # same weights so far
    assert torch.count_nonzero(values.batch["values"]) == 0  # fresh value head

    batch = gen.union(old).union(ref).union(values)
    mask = batch.batch["response_mask"].float()
    batch.batch["advantages"] = torch.randn(PROMPTS * N, R, generator=torch.Generator().manual_seed(0)) * mask
    batch.batch["returns"] = batch.batch["advantages"].clone()
    actor_metrics = actor.update_actor(batch).meta_info["metrics"]
    critic_metrics = critic.update_critic(batch).meta_info["metrics"]
    assert {
        "actor/pg_loss",
        "actor/pg_clipfrac",
        "actor/ppo_kl",
        "actor/entropy",
        "actor/grad_norm",
        "actor/lr",
    } <= set(actor_metrics)
    assert {"critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm", "critic/lr"} <= set(
        critic_metrics
    )
    for metrics in (actor_metrics, critic_metrics):
        assert all(math.isfinite(v) for values_ in metrics.values() for v in values_)
    assert len(actor_metrics["actor/grad_norm"]) == 2  # one mini-batch on each of the 2 ranks
    for role, metrics in (("actor", actor_metrics), ("critic", critic_metrics)):
        assert all(0 < v < 1 for v in metrics[f"perf/mfu/{role}"])  # the sharded model's FLOPs, a measured peak
        assert all(v > 0 for v in metrics["perf/cpu_memory_used_gb"] + metrics["perf/peak_tflops"])

    new = actor.compute_log_prob(batch).batch["old_log_probs"]
    assert not torch.allclose(new, old.batch["old_log_probs"])
    torch.testing.assert_close(actor.compute_ref_log_prob(batch).batch["ref_log_prob"], ref.batch["ref_log_prob"])
    assert torch.count_nonzero(critic.compute_values(batch).batch["values"]) > 0


def test_validation_kwargs_in_meta_info_override_sampling(groups):
    greedy = groups["actor_rollout_ref"].generate_sequences(_prompts(temperature=0.0, do_sample=False))
    responses = greedy.batch["responses"]
    assert torch.equal(responses[0::2], responses[1::2])  # the n copies of a prompt agree when greedy
