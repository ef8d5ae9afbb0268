"""The log-prob, reference, value, reward-model, teacher and update phases of one rank on ``meta``: ColoRL's own
code with a device-strict stand-in model (``tests.fake_cuda.standin``). The batch arrives on the CPU, as a
worker's ``DataProto`` does; every micro-batch moves to the model's device. A CPU tensor mixed into the device
arithmetic, or a value read on the host outside ``algos.host_sync``, raises on ``meta``."""

from __future__ import annotations

import pytest
import torch

import workers.compute.update as update_module
from algos.host_sync import READS
from config.sections import CriticModelConfig, ModelConfig, OptimConfig
from tests.fake_cuda.standin import StandinLM
from tests.workers.helpers import actor_config, critic_config, make_update_batch
from workers.compute.actor import DataParallelPPOActor
from workers.compute.critic import DataParallelPPOCritic
from workers.compute.logprob import token_stats
from workers.compute.reward_model import device_sequence_scores
from workers.compute.teacher import device_scores
from workers.compute.update import to_device
from workers.parallel.lora import add_adapters
from workers.parallel.master_weights import on_one_rank, optimizer_for
from workers.parallel.optim import build_optimizer

pytestmark = pytest.mark.fake_cuda

META = torch.device("meta")
B, P, R = 6, 5, 4


def meta_model(head: str = "lm") -> torch.nn.Module:
    with META:
        return StandinLM(head)


def _batch(shared_prompts: bool = False):
    data = make_update_batch(B, P, R)
    if shared_prompts:  # pairs of rows repeat a prompt, as a GRPO group's samples do
        for key in ("input_ids", "attention_mask", "position_ids"):
            data.batch[key][1::2, :P] = data.batch[key][0::2, :P]
    return data


@pytest.mark.parametrize(
    "remove_padding, share_prompts, fused",
    [(False, False, True), (False, False, False), (True, False, True), (True, True, True), (False, True, False)],
    ids=["padded-fused", "padded-unfused", "rmpad-fused", "rmpad-shared-fused", "padded-shared-unfused"],
)
@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed", "dynamic_bsz"])
def test_log_probs_and_entropy_on_meta(remove_padding, share_prompts, fused, dynamic):
    actor = DataParallelPPOActor(
        meta_model(),
        None,
        None,
        actor_config(),
        use_remove_padding=remove_padding,
        use_fused_kernels=fused,
        use_prefix_grouper=share_prompts,
    )
    out = actor.device_token_stats(
        _batch(share_prompts),
        micro_batch_size=2,
        max_token_len=16 if dynamic else None,
        stats=("entropy", "sum_pi_squared"),
    )
    assert {k: (v.device, v.shape) for k, v in out.items()} == {
        k: (META, (B, R)) for k in ("log_probs", "entropy", "sum_pi_squared")
    }


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_reference_kl_and_teacher_topk_on_meta(fused):
    """The exact KL to a reference model and the log-probs at a teacher's top-k ids (one forward), then a frozen
    teacher's own top-k scores."""
    data = _batch()
    micro = to_device(dict(data.batch), torch.arange(B), META)
    topk_ids = torch.randint(0, 48, (B, R, 3)).to(META)
    out = token_stats(meta_model(), micro, R, 0.7, False, fused, ("entropy",), meta_model(), topk_ids=topk_ids)
    assert out["kl"].device == META and out["topk_log_probs"].shape == (B, R, 3)
    scores = device_scores(meta_model(), data, 2, None, remove_padding=True, fused=fused, topk=3)
    assert {k: v.shape for k, v in scores.items()} == {
        "teacher_topk_ids": (B, R, 3),
        "teacher_topk_log_probs": (B, R, 3),
    }
    assert all(v.device == META for v in scores.values())


def test_reward_model_scores_on_meta():
    scores = device_sequence_scores(meta_model("score"), _batch(), micro_batch_size=4)
    assert scores.device == META and scores.shape == (B,)


@pytest.mark.parametrize("remove_padding", [False, True], ids=["padded", "rmpad"])
def test_values_on_meta(remove_padding):
    critic = DataParallelPPOCritic(
        meta_model("score"),
        None,
        None,
        critic_config(
            "unused",
            model=CriticModelConfig(path="unused", use_remove_padding=remove_padding),
            use_dynamic_bsz=remove_padding,
            forward_max_token_len_per_gpu=16,
        ),
    )
    values = critic.device_values(_batch())
    assert values.device == META and values.shape == (B, R)


def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)  # fused AdamW has no meta kernels


@pytest.mark.parametrize(
    "overrides",
    [
        dict(),
        dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=16, loss_agg_mode="seq-mean-token-mean"),
        dict(loss_agg_mode="seq-mean-token-sum-norm", entropy_coeff=0.01, use_kl_loss=True, ppo_epochs=2),
        dict(use_kl_loss=True, kl_loss_type="full", loss_agg_mode="token-sum", shuffle=True),
    ],
    ids=["default", "dynamic_bsz", "entropy_kl_epochs", "full_kl"],
)
def test_actor_update_on_meta(overrides):
    """Micro-batches (fixed or by token budget), loss aggregation, the KL and entropy terms, gradient clipping and
    AdamW's step, on ``meta``; the only host read is the step's finite-norm check."""
    model = meta_model()
    cfg = actor_config(**overrides)
    ref = meta_model() if cfg.kl_loss_type == "full" else None
    actor = DataParallelPPOActor(model, _optimizer(model), None, cfg, ref_module=ref)
    before = READS["update.grad_norm_finite"]
    metrics = _metrics_on_meta(lambda: actor.update_policy(_batch()))
    steps = cfg.ppo_epochs * (B // cfg.ppo_mini_batch_size + (B % cfg.ppo_mini_batch_size > 0))
    assert READS["update.grad_norm_finite"] - before == steps
    assert {"actor/pg_loss", "actor/grad_norm", "actor/entropy"} <= set(metrics)


def test_critic_update_on_meta():
    model = meta_model("score")
    critic = DataParallelPPOCritic(model, _optimizer(model), None, critic_config("unused"))
    data = _batch()
    data.batch["values"], data.batch["returns"] = torch.randn(B, R), torch.randn(B, R)
    metrics = _metrics_on_meta(lambda: critic.update_critic(data))
    assert {"critic/vf_loss", "critic/grad_norm"} <= set(metrics)


def _metrics_on_meta(update):
    """The update's metrics: their one copy to the host per step fails on ``meta`` (nothing to copy), after every
    device computation has run; each metric tensor it was about to copy is checked to be on ``meta``."""
    seen = {}

    def keep(metrics):
        seen.update(metrics)
        return metrics

    original = update_module.to_float_metrics
    update_module.to_float_metrics = keep
    try:
        update()
    finally:
        update_module.to_float_metrics = original
    for key, values in seen.items():
        for value in values:
            if isinstance(value, torch.Tensor) and key not in CPU_METRICS:
                assert value.device == META, key
    return seen


CPU_METRICS = {"actor/kl_coef"}  # a config constant, logged as is


def test_lora_update_steps_only_the_adapters_on_meta():
    """LoRA: the optimizer ColoRL builds holds the adapters only; the update (with the exact KL to the actor's own
    adapter-free reference) runs on ``meta``."""
    model = add_adapters(meta_model(), ModelConfig(lora_rank=4, target_modules=["q_proj", "v_proj"]))
    optimizer = build_optimizer(model, OptimConfig(lr=1e-3))
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    names = [n for n, p in model.named_parameters() if id(p) in stepped]
    assert names and all("lora_" in n for n in names)
    actor = DataParallelPPOActor(
        model, optimizer, None, actor_config(use_kl_loss=True, kl_loss_type="full"), ref_module=model
    )
    metrics = _metrics_on_meta(lambda: actor.update_policy(_batch()))
    assert {"actor/pg_loss", "actor/kl_loss"} <= set(metrics)
    assert all(p.grad is None for p in model.parameters())  # zeroed after each step


def test_bf16_update_with_fp32_master_weights_on_meta():
    """One rank in bf16: the module computes in bf16, the optimizer steps the fp32 masters (``MasterWeights``)."""
    module, weights = on_one_rank(meta_model(), torch.bfloat16, trained=True)
    optimizer = optimizer_for(module, weights, OptimConfig(lr=1e-3))
    assert all(p.dtype == torch.float32 and p.device == META for g in optimizer.param_groups for p in g["params"])
    actor = DataParallelPPOActor(module, optimizer, None, actor_config())
    metrics = _metrics_on_meta(lambda: actor.update_policy(_batch()))
    assert "actor/grad_norm" in metrics
    assert all(p.dtype == torch.bfloat16 and p.device == META for p in module.parameters())


# Not on meta, with the reason: FSDP2's process group (the all-reduces of micro_batch_indices and
# mini_batch_totals, the sharded gradient norm of workers.parallel.fsdp.clip_grad_norm_) needs a real backend:
# tests/workers/test_fsdp_distributed.py runs them on gloo. The arithmetic they wrap runs here on a plain module.
