"""verl's quickstart and example command lines load with verl's meaning: the algorithm they resolve to, the keys
ColoRL accepts with a warning, and what it still refuses."""

import pytest

from tests.verl_compat.cli import commands
from verl_compat.cli import ConfigError, load_config, make_plan, num_workers
from verl_compat.cli.inert import inert_warnings

PATHS = {
    "model": "/models/Qwen2.5-0.5B-Instruct",
    "train": "/data/gsm8k/train.parquet",
    "val": "/data/gsm8k/test.parquet",
}

# command -> (estimator, critic, rollout.n, KL loss type or None, KL in the reward, keys that warn): every command
# line but the quickstart names rollout.name=vllm, whose engine reads its keys (cli.inert.VLLM_KEYS): none warns
EXPECTED = {
    "quickstart": ("gae", True, 1, None, False, {"rollout.gpu_memory_utilization"}),
    "ppo": ("gae", True, 1, None, False, set()),
    "grpo": ("grpo", False, 5, "low_var_kl", False, set()),
    "grpo_lora": ("grpo", False, 5, "low_var_kl", False, set()),
    "rloo": ("rloo", False, 5, None, True, set()),
    "remax": ("remax", False, 4, None, True, set()),
    "reinforce_plus_plus": ("reinforce_plus_plus", False, 8, "mse", False, set()),
}
COMMANDS = {
    "quickstart": commands.QUICKSTART,
    "ppo": commands.PPO,
    "grpo": commands.GRPO,
    "grpo_lora": commands.GRPO_LORA,
    "rloo": commands.RLOO,
    "remax": commands.REMAX,
    "reinforce_plus_plus": commands.REINFORCE_PP,
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_verl_command_lines_resolve_to_verls_algorithm(name):
    cfg = load_config(commands.overrides(COMMANDS[name], **PATHS))
    estimator, critic, n, kl_loss, kl_in_reward, warned = EXPECTED[name]
    plan = make_plan(cfg, num_workers(cfg))
    actor = cfg.actor_rollout_ref.actor
    assert (cfg.algorithm.adv_estimator, plan.use_critic, cfg.actor_rollout_ref.rollout.n) == (estimator, critic, n)
    assert (actor.kl_loss_type if actor.use_kl_loss else None, cfg.algorithm.use_kl_in_reward) == (
        kl_loss,
        kl_in_reward,
    )
    assert plan.use_reference_policy == (kl_loss is not None or kl_in_reward)
    assert cfg.actor_rollout_ref.model.path == PATHS["model"] and cfg.data.val_files == PATHS["val"]
    assert cfg.trainer.total_training_steps is None  # the length comes from trainer.total_epochs, as in verl
    assert cfg.data.truncation == "error" and cfg.trainer.critic_warmup == 0
    lines = inert_warnings(cfg)
    assert {line.split("=")[0].removeprefix("actor_rollout_ref.") for line in lines} == warned
    assert all("set " in line and "to silence this" in line for line in lines)


def test_the_quickstart_on_vllm_warns_nothing():
    """verl's quickstart with its rollout engine named (verl 0.9 requires rollout.name): every key means what it
    means in verl, so no line warns."""
    cfg = load_config([*commands.overrides(commands.QUICKSTART, **PATHS), "actor_rollout_ref.rollout.name=vllm"])
    assert inert_warnings(cfg) == []
    assert cfg.actor_rollout_ref.rollout.gpu_memory_utilization == 0.4


def test_the_quickstart_keeps_verls_other_defaults():
    cfg = load_config(commands.overrides(commands.QUICKSTART, **PATHS))
    assert cfg.trainer.logger == ["console"] and cfg.trainer.total_epochs == 15 and not cfg.trainer.val_before_train
    assert cfg.critic.optim.lr == 1e-5 and cfg.critic.model.path == PATHS["model"]
    assert cfg.critic.forward_micro_batch_size_per_gpu == 4  # follows critic.ppo_micro_batch_size_per_gpu
    optim = cfg.actor_rollout_ref.actor.optim
    assert (optim.lr, optim.weight_decay, optim.betas) == (1e-6, 0.01, [0.9, 0.999])
    assert cfg.trainer.default_local_dir == "checkpoints/verl_examples/gsm8k"


def test_verl_spellings_carry_over():
    base = commands.overrides(commands.QUICKSTART, **PATHS)
    cfg = load_config(
        [
            *base,
            "trainer.logger=console",
            "critic.model.fsdp_config.param_offload=true",
            "actor_rollout_ref.rollout.name=hf",
        ]
    )
    assert cfg.trainer.logger == ["console"]  # a single backend name is a list of one
    assert cfg.critic.fsdp.param_offload  # verl's older critic.model.fsdp_config is its critic.fsdp
    # the quickstart's one off-default engine key is the only warning left: rollout.name=hf is ColoRL's own
    warned = [line.split("=")[0] for line in inert_warnings(cfg)]
    assert warned == ["actor_rollout_ref.rollout.gpu_memory_utilization"]


def test_verls_multi_turn_keys_carry_over_and_engine_keys_warn():
    """The keys of verl's tool-agent example run script (sglang, async agent loop) load with verl's meaning."""
    mt = "actor_rollout_ref.rollout.multi_turn"
    cfg = load_config(
        [
            *commands.overrides(commands.QUICKSTART, **PATHS),
            "actor_rollout_ref.rollout.name=sglang",
            "actor_rollout_ref.rollout.mode=async",
            f"{mt}.enable=true",
            f"{mt}.max_assistant_turns=5",
            f"{mt}.max_user_turns=5",
            f"{mt}.max_parallel_calls=2",
            f"{mt}.max_tool_response_length=1200",
            f"{mt}.tool_response_truncate_side=left",
            f"{mt}.format=hermes",
            f"{mt}.tool_config_path=conf/tools/gsm8k.yaml",
            f"{mt}.use_inference_chat_template=true",
            "actor_rollout_ref.rollout.agent.num_workers=4",
            "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        ]
    )
    multi_turn = cfg.actor_rollout_ref.rollout.multi_turn
    assert (multi_turn.max_assistant_turns, multi_turn.max_user_turns, multi_turn.max_parallel_calls) == (5, 5, 2)
    assert (multi_turn.max_tool_response_length, multi_turn.tool_response_truncate_side) == (1200, "left")
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "tool_agent"
    warned = sorted(line.split("=")[0] for line in inert_warnings(cfg))
    assert warned == [
        "actor_rollout_ref.rollout.agent.num_workers",
        "actor_rollout_ref.rollout.gpu_memory_utilization",
        f"{mt}.use_inference_chat_template",
        "actor_rollout_ref.rollout.name",
    ]


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "actor_rollout_ref.rollout.multi_turn.interaction_config_path=x.yaml",
            "actor_rollout_ref.rollout.multi_turn.interaction_config_path='x.yaml': verl's simulated-user",
        ),
        (
            "actor_rollout_ref.rollout.multi_turn.format=gpt-oss",
            "actor_rollout_ref.rollout.multi_turn.format='gpt-oss': must be one of hermes",
        ),
        ("actor_rollout_ref.rollout.name=trtllm", "actor_rollout_ref.rollout.name='trtllm': must be one of hf, vllm"),
        ("actor_rollout_ref.rollout.no_such_key=1", "unknown config key 'actor_rollout_ref.rollout.no_such_key'"),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null", "ppo_micro_batch_size_per_gpu=null: set"),
    ],
)
def test_what_would_change_the_result_is_refused(override, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(")):
        load_config([*commands.overrides(commands.QUICKSTART, **PATHS), override])


def test_without_a_model_or_data_the_demo_runs_and_with_one_verls_defaults():
    demo = load_config([])
    assert (demo.algorithm.adv_estimator, demo.actor_rollout_ref.rollout.n) == ("grpo", 8)
    with pytest.raises(ConfigError, match="micro_batch_size_per_gpu=null"):  # verl's: no default micro-batches
        load_config([f"actor_rollout_ref.model.path={PATHS['model']}"])
