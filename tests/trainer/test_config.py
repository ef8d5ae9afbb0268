"""The config schema: defaults, overrides, and one-line errors that name the key and the value."""

import dataclasses

import pytest
import torch

from config import ConfigError, PPOConfig, replace_keys, resolve_device, to_config
from config.adapter import installed
from config.schema import DataConfig
from planner import load_config, make_plan, num_workers, uses_critic


def test_verls_preset_is_the_schema_and_the_demo_is_a_preset_on_it():
    verl = load_config(
        [
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
            "critic.ppo_micro_batch_size_per_gpu=4",
        ],
        config_name="ppo_trainer",
    )
    schema = replace_keys(
        installed().schema()(),  # the schema the loader composes on (with the door's keys: tests/conftest.py)
        {
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
            "critic.ppo_micro_batch_size_per_gpu": 4,
        },
    )
    assert verl == to_config(dataclasses.asdict(schema))  # conf/ppo_trainer.yaml adds nothing to the schema
    assert (verl.algorithm.adv_estimator, verl.actor_rollout_ref.rollout.n, verl.data.train_batch_size) == (
        "gae",
        1,
        1024,
    )
    assert verl.critic.forward_micro_batch_size_per_gpu == 4  # follows critic.ppo_micro_batch_size_per_gpu
    cfg = load_config([])  # no model or data named: the built-in demo
    assert isinstance(cfg, PPOConfig)
    assert (cfg.algorithm.adv_estimator, cfg.actor_rollout_ref.rollout.n, cfg.trainer.total_training_steps) == (
        "grpo",
        8,
        700,
    )
    assert cfg.actor_rollout_ref.rollout.prompt_length == cfg.data.max_prompt_length
    assert cfg.critic.rollout_n == cfg.actor_rollout_ref.rollout.n
    assert cfg.trainer.default_local_dir == "outputs/colorl/copy_demo"
    assert cfg.trainer.logger == ["console", "file"]
    assert not uses_critic(cfg)  # grpo needs no critic
    assert num_workers(cfg) == cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes


def test_overrides_apply_and_interpolations_follow():
    cfg = load_config(
        [
            "data.max_prompt_length=32",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
            "critic.ppo_micro_batch_size_per_gpu=32",
            "actor_rollout_ref.actor.optim.lr=3e-4",
            "algorithm.adv_estimator=gae",
            "trainer.logger=[console,wandb]",
            "data.train_files=[a.parquet,b.parquet]",
        ],
        config_name="demo",
    )
    assert cfg.actor_rollout_ref.rollout.prompt_length == 32
    assert cfg.critic.ppo_mini_batch_size == 8
    assert cfg.actor_rollout_ref.actor.optim.lr == pytest.approx(3e-4)
    assert cfg.data.train_files == ["a.parquet", "b.parquet"]
    assert uses_critic(cfg)
    assert cfg.trainer.logger == ["console", "wandb"]
    assert cfg.critic.model.trust_remote_code is False  # follows the actor's flag
    assert load_config(["actor_rollout_ref.model.trust_remote_code=true"]).critic.model.trust_remote_code is True


def test_the_config_is_frozen_and_replace_keys_rechecks():
    cfg = load_config([])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.trainer.device = "cpu"  # type: ignore[misc]
    changed = replace_keys(cfg, {"trainer.device": "cpu", "data.train_batch_size": 8})
    assert (changed.trainer.device, changed.data.train_batch_size, cfg.trainer.device) == ("cpu", 8, "auto")
    with pytest.raises(ConfigError, match=r"^train_batch_size=0"):
        replace_keys(cfg, {"data.train_batch_size": 0})


@pytest.mark.parametrize(
    "overrides, expected",
    [
        # unknown keys, also forced in with "+"
        (["data.foo=1"], ["unknown config key 'data.foo'", "train_batch_size"]),
        (["+data.foo=1"], ["unknown config key 'data.foo'"]),
        (["foo=1"], ["unknown config key 'foo'", "trainer"]),
        # wrong types
        (["data.train_batch_size=abc"], ["data.train_batch_size='abc'", "expected int"]),
        (["actor_rollout_ref.actor.optim.betas=[0.9,x]"], ["actor_rollout_ref.actor.optim.betas[1]='x'", "float"]),
        # enums
        (
            ["actor_rollout_ref.actor.loss_agg_mode=mean"],
            ["actor_rollout_ref.actor.loss_agg_mode='mean'", "token-mean"],
        ),
        (["actor_rollout_ref.actor.kl_loss_type=k9"], ["actor_rollout_ref.actor.kl_loss_type='k9'", "low_var_kl"]),
        (["algorithm.kl_penalty=k9"], ["algorithm.kl_penalty='k9'"]),
        (["algorithm.kl_penalty=full"], ["algorithm.kl_penalty='full'", "low_var_kl", "kl_loss_type"]),
        (["algorithm.kl_ctrl.type=pid"], ["algorithm.kl_ctrl.type='pid'", "adaptive"]),
        (["algorithm.adv_estimator=ppo2"], ["algorithm.adv_estimator='ppo2'", "gae", "grpo"]),
        (["trainer.device=gpu"], ["trainer.device='gpu'", "auto"]),
        (["trainer.logger=[console,tensorboard]"], ["trainer.logger[1]=", "tensorboard", "wandb"]),
        # ranges
        (["data.train_batch_size=0"], ["data.train_batch_size=0: must be a positive integer"]),
        (["critic.optim.lr=-1"], ["critic.optim.lr=-1"]),
        (["actor_rollout_ref.rollout.val_kwargs.top_p=0"], ["actor_rollout_ref.rollout.val_kwargs.top_p=0"]),
        (["algorithm.gamma=1.5"], ["algorithm.gamma=1.5"]),
        # a value Hydra's override grammar cannot read: the character, and the value quoted
        (
            ["trainer.default_local_dir=~/ckpt"],
            ["trainer.default_local_dir=~/ckpt: '~'", "'trainer.default_local_dir=\"~/ckpt\"'"],
        ),
    ],
)
def test_bad_values_name_key_and_value(overrides, expected):
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    message = str(info.value)
    assert "\n" not in message
    for part in expected:
        assert part in message


def test_an_unreadable_override_proposes_one_that_loads():
    with pytest.raises(ConfigError) as info:
        load_config(["trainer.default_local_dir=~/ckpt"])
    proposed = str(info.value).rpartition("quote the value: ")[2].strip("'")
    assert load_config([proposed]).trainer.default_local_dir == "~/ckpt"


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["data.train_batch_size=7", "actor_rollout_ref.rollout.n=1", "trainer.n_gpus_per_node=2"],
            ["data.train_batch_size=7", "actor_rollout_ref.rollout.n=1", "2 workers"],
        ),
        (["data.train_batch_size=8"], ["actor_rollout_ref.actor.ppo_mini_batch_size=16", "data.train_batch_size=8"]),
        (
            [
                "actor_rollout_ref.actor.ppo_mini_batch_size=3",
                "data.train_batch_size=6",
                "actor_rollout_ref.rollout.n=3",
            ],
            ["actor_rollout_ref.actor.ppo_mini_batch_size=3", "actor_rollout_ref.rollout.n=3", "2 workers"],
        ),
        (
            ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=24"],
            ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=24", "64"],
        ),
        (
            ["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=48"],
            ["critic.ppo_micro_batch_size_per_gpu=48"],
        ),
        (
            ["actor_rollout_ref.rollout.n=1", "algorithm.adv_estimator=grpo_passk"],
            ["actor_rollout_ref.rollout.n=1", "grpo_passk"],
        ),
        (["algorithm.adv_estimator=gae", "critic.enable=false"], ["critic.enable=false", "gae"]),
    ],
)
def test_impossible_batch_arithmetic_is_rejected(overrides, expected):
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    for part in expected:
        assert part in str(info.value)


def test_a_group_estimator_with_one_response_per_prompt_warns_and_runs_as_verl_does():
    """Each response is alone in its group: verl counts it as mean 0, std 1 (algos.group_estimators)."""
    with pytest.warns(UserWarning, match="alone in its group"):
        load_config(["actor_rollout_ref.rollout.n=1", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"])


def test_consistent_batches_pass_for_several_worker_counts():
    cfg = load_config(
        [
            "data.train_batch_size=12",
            "actor_rollout_ref.actor.ppo_mini_batch_size=6",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.n=4",
        ]
    )
    for n_workers in (1, 2, 3, 6):  # 6·4 = 24 sequences per mini-batch -> 24, 12, 8, 4 per worker
        assert make_plan(cfg, n_workers).actor_mini_batch_size == 24 // n_workers
    with pytest.raises(ConfigError, match="5 workers"):
        make_plan(cfg, 5)


def test_the_plan_decides_phases_keys_and_per_rank_batches():
    grpo = make_plan(load_config(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16"]), 2)
    assert grpo.actor_mini_batch_size == 16 * 8 // 2 and grpo.critic_mini_batch_size == 0 and not grpo.use_critic
    assert not grpo.recompute_old_log_prob and "old_log_probs" not in update_reads(grpo)  # one on-policy step
    ppo = make_plan(
        load_config(
            [
                "algorithm.adv_estimator=gae",
                "actor_rollout_ref.actor.use_kl_loss=true",
                "actor_rollout_ref.actor.ppo_epochs=2",
            ]
        ),
        2,
    )
    assert ppo.use_critic and ppo.recompute_old_log_prob and ppo.compute_ref_log_prob and not ppo.ref_in_actor
    assert {"old_log_probs", "ref_log_prob"} <= set(update_reads(ppo)) and ppo.critic_mini_batch_size == 64
    full = make_plan(
        load_config(["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=full"]), 2
    )
    assert full.ref_in_actor and full.use_reference_policy and not full.compute_ref_log_prob
    assert "ref_log_prob" not in update_reads(full)  # the update reads the reference logits itself


def update_reads(plan):
    return plan.flows["step"].route("update_actor").reads


def test_critic_enabled_without_use_warns_but_passes():
    with pytest.warns(UserWarning, match="critic.enable=true"):
        cfg = load_config(["critic.enable=true"])
    assert uses_critic(cfg)


def test_component_errors_without_hydra():
    with pytest.raises(ConfigError, match=r"^train_batch_size=0: must be a positive integer$"):
        DataConfig(train_batch_size=0)
    node = dataclasses.asdict(PPOConfig())
    node["actor_rollout_ref"]["actor"]["optim"]["weight_decay"] = -0.1
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref\.actor\.optim\.weight_decay=-0\.1"):
        to_config(node)


def test_resolve_device():
    assert resolve_device(load_config(["trainer.device=cpu"])) == "cpu"
    auto = resolve_device(load_config([]))
    assert auto == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="trainer.device=cpu"):
            resolve_device(load_config(["trainer.device=cuda"]))


def test_mixed_precision_dtypes_are_checked_by_name():
    cfg = load_config(["actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16"])
    assert cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "bf16"
    assert cfg.critic.fsdp.mixed_precision.param_dtype == "auto"
    with pytest.raises(
        ConfigError,
        match=r"^actor_rollout_ref\.actor\.fsdp_config\.mixed_precision\.param_dtype='fp16': "
        r"must be one of auto, native, bf16, fp32, bfloat16, float32$",
    ):
        load_config(["actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp16"])
    with pytest.raises(
        ConfigError,
        match=r"^actor_rollout_ref\.ref\.fsdp_config\.mixed_precision\.reduce_dtype='int8': "
        r"must be one of fp32, bf16, float32, bfloat16$",
    ):
        load_config(["actor_rollout_ref.ref.fsdp_config.mixed_precision.reduce_dtype=int8"])


def test_fsdp_wrap_policy_is_verls_key_and_is_checked():
    """(The critic's older critic.fsdp_config spelling: tests/verl_compat/cli/test_verl_spellings.py.)"""
    cfg = load_config(["critic.fsdp.wrap_policy.min_num_params=0"])
    assert cfg.critic.fsdp.wrap_policy.min_num_params == 0
    assert cfg.actor_rollout_ref.ref.fsdp_config.wrap_policy.min_num_params > 0  # the CPU demo's preset
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref\.actor\.fsdp_config\.wrap_policy\.min_num_params=-1"):
        load_config(["actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params=-1"])
