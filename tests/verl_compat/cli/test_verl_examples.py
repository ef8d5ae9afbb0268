"""verl 0.9.1's example scripts on ColoRL (``commands_v091``): each command line loads and resolves to the
algorithm its script names; the cheapest run one step on 2 CPU workers and show that algorithm ran (the others
behind ``slow``). The scripts' paths are replaced by local ones and their batches cut to CPU size (``CPU``); every
other key is the script's."""

import math
import warnings

import pytest

from data.reward_loop import REWARD_MANAGERS
from tests.verl_compat.cli.commands_v091 import SCRIPTS
from tests.verl_compat.cli.test_verl_e2e import bpe_qwen2
from trainer.running.build import build_trainer
from verl_compat.cli import ConfigError, load_config, make_plan, num_workers
from verl_compat.cli.inert import inert_warnings

REFUSED = {  # what ColoRL refuses in one line because ignoring it would train something else
    "tuning/lora/run_qwen3_8b_from_adapter_fsdp": "model.lora_adapter_path",
    "grpo_trainer/run_gpt_oss_20b_fsdp": "model_dtype='bfloat16': a trained role keeps fp32 master weights",
}
# script -> (estimator, critic, policy loss, KL loss, KL in reward, LoRA, grouper)
EXPECTED = {
    "grpo_trainer/run_qwen3_8b_fsdp": ("grpo", False, "vanilla", True, False, False, False),
    "grpo_trainer/run_qwen3_4b_fsdp": ("grpo", False, "vanilla", True, False, False, False),
    "grpo_trainer/run_mistral_nemo_12b_skyworkrm_fsdp": ("grpo", False, "vanilla", False, False, False, False),
    "grpo_trainer/run_qwen3_5_2b_openr1_fsdp": ("grpo", False, "vanilla", True, False, False, False),
    "ppo_trainer/run_qwen3_8b_fsdp": ("gae", True, "vanilla", False, False, False, False),
    "cispo_trainer/run_qwen3_8b_fsdp": ("grpo", False, "cispo", True, False, False, False),
    "gdpo_trainer/run_qwen3_8b_fsdp": ("gdpo", False, "vanilla", False, False, False, False),
    "gmpo_trainer/run_qwen3_8b_fsdp": ("grpo", False, "geo_mean", True, False, False, False),
    "gpg_trainer/run_qwen3_8b_fsdp": ("gpg", False, "gpg", False, False, False, False),
    "gspo_trainer/run_qwen3_8b_fsdp": ("grpo", False, "gspo", False, False, False, False),
    "otb_trainer/run_qwen3_8b_fsdp": ("optimal_token_baseline", False, "vanilla", False, False, False, False),
    "reinforce_plus_plus_trainer/run_qwen3_8b_fsdp": (
        "reinforce_plus_plus",
        False,
        "vanilla",
        False,
        True,
        False,
        False,
    ),
    "remax_trainer/run_qwen3_8b_fsdp": ("remax", False, "vanilla", False, True, False, False),
    "remax_trainer/run_qwen2.5_math_7b_sync_fsdp": ("remax", False, "vanilla", False, True, False, False),
    "rloo_trainer/run_qwen3_8b_fsdp": ("rloo", False, "vanilla", False, True, False, False),
    "sapo_trainer/run_qwen3_8b_fsdp": ("grpo", False, "sapo", False, False, False, False),
    "prefix_grouper/run_qwen3_8b_fsdp": ("grpo", False, "vanilla", True, False, False, True),
    "rollout_correction/run_qwen2_5_7b_fsdp": ("rloo", False, "bypass_mode", False, False, False, False),
    "rollout_correction/run_qwen2_5_7b_fsdp_multi_rs": ("grpo", False, "bypass_mode", False, False, False, False),
    "tuning/lora/run_qwen3_8b_fsdp": ("grpo", False, "vanilla", True, False, True, False),
    "tuning/lora/run_qwen3_8b_merge_fsdp": ("grpo", False, "vanilla", True, False, True, False),
    "on_policy_distillation_trainer/run_qwen3_8b_fsdp": ("grpo", False, "vanilla", False, False, False, False),
    "one_step_off_policy/dapo_7b_math_fsdp2_colocate": ("grpo", False, "vanilla", False, False, False, False),
    "docs/algo/dapo": ("grpo", False, "vanilla", False, False, False, False),
}
# on-policy distillation's script: (the distillation loss, its top-k, task rewards, as a policy gradient)
DISTILLATION = {"on_policy_distillation_trainer/run_qwen3_8b_fsdp": ("k1", 64, False, True)}
# DAPO's scripts: (dynamic sampling's filter metric or None, the reward manager, clip_ratio_high)
DAPO = {
    "one_step_off_policy/dapo_7b_math_fsdp2_colocate": (None, "dapo", 0.28),
    "docs/algo/dapo": ("acc", "naive", 0.28),
}
PATH_KEYS = {
    "actor_rollout_ref.model.path": "model",
    "critic.model.path": "model",
    "data.train_files": "train",
    "data.val_files": "val",
    "reward.reward_model.model_path": "model",
    "reward.custom_reward_function.path": "reward",
    "distillation.teacher_models.teacher_model.model_path": "model",  # the student's own model as its teacher
}
CPU = [  # this machine: 2 workers, 2 prompts, short sequences, one step, ColoRL's own rollout engine
    "data.train_batch_size=2",
    "data.max_prompt_length=256",
    "data.max_response_length=8",
    "data.filter_overlong_prompts=false",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=4096",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=4096",
    "actor_rollout_ref.rollout.name=hf",
    "actor_rollout_ref.rollout.prompt_length=256",
    "actor_rollout_ref.rollout.response_length=8",
    "critic.ppo_micro_batch_size_per_gpu=1",
    "critic.ppo_max_token_len_per_gpu=4096",
    "actor_rollout_ref.actor.fsdp_config.param_offload=false",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false",
    "actor_rollout_ref.ref.fsdp_config.param_offload=false",
    "trainer.n_gpus_per_node=2",
    "trainer.nnodes=1",
    "trainer.device=cpu",
    "trainer.total_training_steps=1",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "trainer.logger=[console]",
]


SCALED = {"data.gen_batch_size": "2"}  # DAPO's generation batches, of the CPU training batch (3 fixture prompts)


def command(name: str, paths: dict[str, str]) -> list[str]:
    """The script's overrides with local paths and CPU-sized generation batches, then the CPU sizes."""
    out = []
    for override in SCRIPTS[name]:
        key = override.lstrip("+").partition("=")[0]
        if key in PATH_KEYS:
            override = f"{key}={paths[PATH_KEYS[key]]}"
        elif key in SCALED:
            override = f"{key}={SCALED[key]}"
        out.append(override)
    return out + CPU


PATHS = {"model": "/models/tiny", "train": "/data/train.parquet", "val": "/data/test.parquet", "reward": "/r.py"}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_every_example_loads_with_its_algorithm(name):
    if name in REFUSED:
        with pytest.raises(ConfigError, match=REFUSED[name]) as info:
            load_config(command(name, PATHS))
        assert "\n" not in str(info.value)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rollout.n=1 with a group estimator warns, as it should
        cfg = load_config(command(name, PATHS))
    plan = make_plan(cfg, num_workers(cfg))
    actor = cfg.actor_rollout_ref.actor
    estimator, critic, loss, kl_loss, kl_reward, lora, grouper = EXPECTED[name]
    assert (cfg.algorithm.adv_estimator, plan.use_critic, actor.policy_loss.loss_mode) == (estimator, critic, loss)
    assert (actor.use_kl_loss, cfg.algorithm.use_kl_in_reward) == (kl_loss, kl_reward)
    assert (cfg.actor_rollout_ref.model.lora_rank > 0, actor.use_prefix_grouper) == (lora, grouper)
    assert all("to silence this" in line for line in inert_warnings(cfg))
    if name in DAPO:
        metric, manager, clip_high = DAPO[name]
        assert (plan.filter_metric, plan.dynamic_sampling) == (metric, metric is not None)
        assert (cfg.reward.reward_manager.name, actor.clip_ratio_high) == (manager, clip_high)
    loss = cfg.distillation.distillation_loss
    assert plan.compute_teacher == (name in DISTILLATION) == cfg.distillation.enabled
    if name in DISTILLATION:
        assert (loss.loss_mode, loss.topk, loss.use_task_rewards, loss.use_policy_gradient) == DISTILLATION[name]


FAST = ["grpo_trainer/run_qwen3_8b_fsdp", "ppo_trainer/run_qwen3_8b_fsdp"]  # ~15 s each; the others are slow
NO_E2E = {  # what a one-step CPU run cannot give these scripts
    "grpo_trainer/run_mistral_nemo_12b_skyworkrm_fsdp": "a sequence-classification reward model checkpoint",
    "grpo_trainer/run_qwen3_5_2b_openr1_fsdp": "verl's multimodal reward function file",
    "gdpo_trainer/run_qwen3_8b_fsdp": "verl's rlla reward function file",
}
E2E = [
    pytest.param(n, marks=() if n in FAST else pytest.mark.slow)
    for n in EXPECTED
    if n not in NO_E2E and n not in REFUSED
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Qwen2 and the GSM8K fixture's parquet (``test_verl_e2e``'s)."""
    from data.preprocess.gsm8k import main as preprocess_gsm8k
    from tests.data.gsm8k_fixture import write_gsm8k

    root = tmp_path_factory.mktemp("examples")
    preprocess_gsm8k(["--local_dir", str(write_gsm8k(root / "raw", "jsonl")), "--out_dir", str(root / "gsm8k")])
    signal = root / "signal.py"  # a random model scores 0 on every GSM8K prompt: no group would have signal
    signal.write_text(SIGNAL)
    return {
        "model": bpe_qwen2(root / "qwen2"),
        "train": str(root / "gsm8k" / "train.parquet"),
        "val": str(root / "gsm8k" / "test.parquet"),
        "reward": "",
        "signal": str(signal),
        "run": str(root / "run"),
    }


SIGNAL = """def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(sum(map(ord, solution_str)) % 2), "acc": float(len(solution_str) % 2)}
"""
# what a one-step run adds to a script: a reward whose groups differ, for dynamic sampling to keep some
E2E_EXTRA = {"docs/algo/dapo": ["reward.custom_reward_function.path={signal}"]}


@pytest.mark.parametrize("name", E2E)
def test_example_trains_a_step_of_its_algorithm(ray_cluster, tiny, name):
    extra = [override.format(**tiny) for override in E2E_EXTRA.get(name, [])]
    run_dir = f"trainer.default_local_dir={tiny['run']}/{name.replace('/', '_')}"
    cfg = load_config([*command(name, tiny), *extra, run_dir])
    trainer = build_trainer(cfg)
    trainer.init_workers()
    last = trainer.fit()
    estimator, critic, loss, kl_loss, _, _, _ = EXPECTED[name]
    assert all(math.isfinite(v) for v in last.values())
    assert ("critic/vf_loss" in last) == critic and "actor/pg_loss" in last  # the critic trained iff PPO
    assert ("actor/kl_loss" in last) == kl_loss
    assert trainer.config.algorithm.adv_estimator == estimator
    assert trainer.config.actor_rollout_ref.actor.policy_loss.loss_mode == loss
    assert last["global_seqlen/balanced_max"] <= last["global_seqlen/max"]  # the scripts' balance_batch=True
    if name in DAPO:  # dynamic sampling drew generation batches and filtered groups; the script's reward manager
        metric, manager, _ = DAPO[name]
        assert ("train/num_gen_batches" in last) == (metric is not None)
        assert ("training/filter_groups/evicted_samples" in last) == (metric is not None)
        assert type(trainer.reward_fn) is REWARD_MANAGERS[manager]
    if name in DISTILLATION:  # the teacher (the student's own model) scored the samples: a divergence of 0
        assert "timing_s/teacher" in last and abs(last["distillation/loss"]) < 1e-5
