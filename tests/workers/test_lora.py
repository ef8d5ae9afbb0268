"""LoRA on one process: adapters at init change nothing, the reference is the base model, only adapters train,
and a checkpoint holds (and restores) only the adapters."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from config import ConfigError
from config.sections import (
    ActorRolloutRefConfig,
    FSDPConfig,
    MixedPrecisionConfig,
    ModelConfig,
    RefConfig,
    RolloutConfig,
)
from planner import make_plan
from tests.workers.helpers import actor_config, make_update_batch, worker_config
from workers.checkpoint.shards import PlainReader, load_role, save_role
from workers.compute.actor import DataParallelPPOActor
from workers.compute.rollout import generate_sequences
from workers.parallel import fsdp, lora
from workers.parallel.master_weights import checkpointed
from workers.roles.role import TrainedRole

P, R, ROWS = 6, 5, 4
ONE_CPU = SimpleNamespace(device=torch.device("cpu"), world_size=1)


def _lora_role(path: str, fsdp_config: FSDPConfig | None = None, **lora_keys) -> TrainedRole:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model_config = ModelConfig(path=path, lora_rank=lora_keys.pop("lora_rank", 4), **lora_keys)
    return TrainedRole(
        ONE_CPU, lora.add_adapters(model, model_config), fsdp_config or FSDPConfig(), actor_config().optim, 3
    )


def _log_probs(module, batch) -> torch.Tensor:
    return DataParallelPPOActor(module, None, None, actor_config()).compute_log_prob(batch, micro_batch_size=ROWS)[0]


def _update(role: TrainedRole, batch, **overrides) -> dict:
    cfg = actor_config(ppo_mini_batch_size=ROWS, **overrides)
    actor = DataParallelPPOActor(role.module, role.optimizer, role.lr_scheduler, cfg, ROWS, ref_module=role.module)
    return actor.update_policy(batch)


@pytest.fixture
def base(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def test_adapters_at_init_change_nothing_and_disabled_they_give_the_base_model(tiny_model_dir, base):
    batch = make_update_batch(ROWS, P, R)
    role = _lora_role(tiny_model_dir)
    expected = _log_probs(base, batch)
    assert torch.equal(_log_probs(role.module, batch), expected)  # peft initialises B = 0
    _update(role, batch)
    assert not torch.equal(_log_probs(role.module, batch), expected)
    with lora.as_reference(role.module):
        assert torch.equal(_log_probs(role.module, batch), expected)
    assert not torch.equal(_log_probs(role.module, batch), expected)  # adapters back on after the reference
    assert all(p.requires_grad for n, p in role.module.named_parameters() if ".lora_" in n)  # and still trained


def test_only_the_adapters_are_trained(tiny_model_dir, base):
    role = _lora_role(tiny_model_dir)
    trained = {id(p) for group in role.optimizer.param_groups for p in group["params"]}
    names = {name for name, p in role.module.named_parameters() if id(p) in trained}
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    # "all-linear": every linear layer of every block, not the (tied) LM head
    assert len(names) == 2 * 7 * base.config.num_hidden_layers
    _update(role, make_update_batch(ROWS, P, R))
    frozen = {k: v for k, v in role.module.base_model.model.state_dict().items() if "lora_" not in k}
    assert all(
        torch.equal(v.reshape(-1), base.state_dict()[k.replace(".base_layer", "")].reshape(-1))
        for k, v in frozen.items()
    )


def test_exact_kl_to_the_adapters_disabled_reference_starts_at_zero(tiny_model_dir):
    role = _lora_role(tiny_model_dir)
    batch = make_update_batch(ROWS, P, R)
    metrics = _update(role, batch, use_kl_loss=True, kl_loss_type="full")
    assert metrics["actor/kl_loss"] == [0.0, 0.0]  # two micro-batches, before the first optimizer step
    assert _update(role, batch, use_kl_loss=True, kl_loss_type="full")["actor/kl_loss"][0] > 0


def test_target_modules_picks_the_adapted_layers(tiny_model_dir):
    role = _lora_role(tiny_model_dir, target_modules=["q_proj", "v_proj"])
    adapted = {n.split(".")[-4] for n, p in role.module.named_parameters() if p.requires_grad}
    assert adapted == {"q_proj", "v_proj"}
    with pytest.raises(ValueError, match="target_modules=.*nope"):
        _lora_role(tiny_model_dir, target_modules=["nope"])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_checkpoint_holds_only_the_adapters_and_restores_them(tiny_model_dir, tmp_path, dtype):
    """bf16 on one rank computes on a cast copy over fp32 masters (MasterWeights): they are what is saved."""
    fsdp_config = FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype=dtype))
    role = _lora_role(tiny_model_dir, fsdp_config)
    batch = make_update_batch(ROWS, P, R)
    _update(role, batch)
    save_role(
        str(tmp_path),
        checkpointed(role.module, role.weights),
        role.optimizer,
        role.lr_scheduler,
        AutoTokenizer.from_pretrained(tiny_model_dir),
    )
    saved = PlainReader(tmp_path).read_metadata().state_dict_metadata
    assert all(".lora_A." in k or ".lora_B." in k for k in saved if k.startswith("model."))  # no base weight
    assert (tmp_path / "adapter_config.json").exists()

    fresh = _lora_role(tiny_model_dir, fsdp_config)
    load_role(str(tmp_path), checkpointed(fresh.module, fresh.weights), fresh.optimizer, fresh.lr_scheduler)
    assert torch.equal(_log_probs(fresh.module, batch), _log_probs(role.module, batch))
    assert fresh.optimizer.state_dict()["state"].keys() == role.optimizer.state_dict()["state"].keys()


def test_checkpoint_of_the_other_kind_or_rank_is_a_clear_error(tiny_model_dir, tmp_path):
    role = _lora_role(tiny_model_dir)
    save_role(
        str(tmp_path), role.module, role.optimizer, role.lr_scheduler, AutoTokenizer.from_pretrained(tiny_model_dir)
    )
    other = _lora_role(tiny_model_dir, lora_rank=2)
    with pytest.raises(ValueError, match="does not fit this model"):
        load_role(str(tmp_path), other.module, other.optimizer, other.lr_scheduler)
    full = TrainedRole(
        ONE_CPU, AutoModelForCausalLM.from_pretrained(tiny_model_dir), FSDPConfig(), actor_config().optim, 3
    )
    with pytest.raises(ValueError, match="holds LoRA adapters, but actor_rollout_ref.model.lora_rank=0"):
        load_role(str(tmp_path), full.module, full.optimizer, full.lr_scheduler)


def test_lora_rank_is_checked_and_puts_the_reference_in_the_actor(tiny_model_dir):
    with pytest.raises(ConfigError, match="lora_rank"):
        ModelConfig(lora_rank=-1)
    with pytest.raises(ConfigError, match="lora_alpha"):
        ModelConfig(lora_alpha=0)
    arr = ActorRolloutRefConfig(
        model=ModelConfig(path=tiny_model_dir, lora_rank=8),
        actor=actor_config(use_kl_loss=True),
        rollout=RolloutConfig(n=2, log_prob_micro_batch_size_per_gpu=4),
        ref=RefConfig(log_prob_micro_batch_size_per_gpu=4),
    )
    cfg, plan = worker_config(arr)
    assert plan.use_reference_policy and plan.ref_in_actor
    no_kl = dataclasses.replace(
        cfg,
        actor_rollout_ref=dataclasses.replace(
            cfg.actor_rollout_ref, actor=dataclasses.replace(cfg.actor_rollout_ref.actor, use_kl_loss=False)
        ),
    )
    assert not make_plan(no_kl, 2).ref_in_actor  # no reference, nothing to hold
    assert not worker_config(dataclasses.replace(arr, model=ModelConfig(path=tiny_model_dir)))[1].ref_in_actor


def test_sampling_with_merged_adapters_is_the_adapted_policy_and_leaves_the_base_alone(tiny_model_dir):
    """Inside ``merged_adapters`` the LoRA linears run as one matmul with W + ΔW (the adapters' own matmuls are not
    called): the same log-probs and greedy tokens as peft's forward; on exit the base weights are bit-identical."""
    role = _lora_role(tiny_model_dir)
    batch = make_update_batch(ROWS, P, R)
    _update(role, batch)  # B != 0: the adapters change the policy
    module = role.module
    frozen = {n: p.detach().clone() for n, p in module.named_parameters() if "lora_" not in n}
    prompts = [batch.batch[k][:, :P] for k in ("input_ids", "attention_mask", "position_ids")]
    greedy = dict(response_length=R, eos_token_id=None, pad_token_id=0, do_sample=False)
    with fsdp.gathered_params(module):
        want_tokens = generate_sequences(module, *prompts, **greedy)["responses"]
    want = _log_probs(module, batch)
    calls = []
    hooks = [
        m.register_forward_hook(lambda *a: calls.append(1))
        for n, m in module.named_modules()
        if n.endswith("lora_A.default")
    ]
    with fsdp.gathered_params(module), lora.merged_adapters(module):
        got_tokens = generate_sequences(module, *prompts, **greedy)["responses"]
        got = _log_probs(module, batch)
    assert hooks and not calls
    assert torch.equal(got_tokens, want_tokens)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert all(torch.equal(p, frozen[n]) for n, p in module.named_parameters() if "lora_" not in n)
    assert not any("forward" in m.__dict__ for m in module.modules())  # peft's forward is back
    _log_probs(module, batch)
    assert calls  # and the adapters run as adapters again
    for hook in hooks:
        hook.remove()
