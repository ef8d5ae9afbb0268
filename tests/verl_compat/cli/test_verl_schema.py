"""ColoRL's schema is verl's: every key of the installed verl's generated PPO trainer config loads with verl's
default, alone on top of conf/ppo_trainer.yaml, and the whole file loads as a config. The key list is read from the
wheel, so a verl release with new keys fails here until the schema has them."""

from pathlib import Path

import pytest
import verl
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from config.load import CONF_DIR
from config.tree import flat
from verl_compat.cli import ConfigError, load_config, to_config
from verl_compat.cli.inert import inert_warnings

VERL_YAML = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
NO_DEFAULT = {"actor_rollout_ref.rollout.name": "vllm", "reward.reward_model.rollout.name": None}  # verl's ???


def verl_config():
    node = OmegaConf.load(VERL_YAML)
    for key, value in NO_DEFAULT.items():
        OmegaConf.update(node, key, value)
    return node


def verl_defaults() -> dict:
    """Each leaf key of verl's config (an interpolation is one key) and its default, resolved as verl resolves it."""
    node = verl_config()
    written = OmegaConf.to_container(node, resolve=False)
    keys = [key for key, _ in flat(written)]
    values = {key: OmegaConf.select(node, key) for key in keys}
    return {key: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for key, v in values.items()}


@pytest.fixture(scope="module")
def base():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name="ppo_trainer")


def test_every_key_of_verls_config_loads_alone_with_verls_default(base):
    """Each key is accepted where a command line puts it (the composed config is struct: an unknown key fails);
    all of them, each with verl's default, build a checked config."""
    defaults = verl_defaults()
    assert len(defaults) > 700  # the wheel's file was read
    refused, together = {}, base.copy()
    for key, value in defaults.items():
        try:
            OmegaConf.update(together, key, value, merge=False)
        except Exception as exc:  # noqa: BLE001 - collected, reported together
            refused[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    assert not refused, f"{len(refused)} of verl's keys refused: {refused}"
    to_config(together)


def test_verls_whole_config_loads_and_records_its_class_names():
    cfg = to_config(verl_config())
    assert cfg.actor_rollout_ref.actor.optim._target_ == "verl.workers.config.FSDPOptimizerConfig"
    assert cfg.critic.fsdp._target_ == "verl.workers.config.FSDPEngineConfig"
    assert cfg.algorithm.filter_groups._target_ == "verl.trainer.config.FilterGroupsConfig"
    assert (
        cfg.distillation.teacher_models["teacher_model"]._target_
        == "verl.workers.config.DistillationTeacherModelConfig"
    )
    assert cfg.global_profiler["global_tool_config"]["nsys"]["controller_nsight_options"]["trace"]
    # verl's file sets nothing ColoRL ignores, and the engine it is given here (vllm) reads its own keys
    assert inert_warnings(cfg) == []


@pytest.mark.parametrize(
    "override, expected",
    [
        ("global_profiler.no_such_key=1", "valid under global_profiler: _target_, tool, steps"),
        ("actor_rollout_ref.actor.fsdp_config.qat.enable=true", "quantisation-aware training is not in ColoRL"),
        ("actor_rollout_ref.rollout.ignore_eos=true", "ends a response at its EOS token"),
        ("actor_rollout_ref.actor.strategy=megatron", "must be one of fsdp, fsdp2"),
        ("actor_rollout_ref.actor.fsdp_config.model_dtype=bf16", "keeps fp32 master weights"),
        ("actor_rollout_ref.actor.fsdp_config.dtype=float16", "must be bfloat16 or float32"),
        ("actor_rollout_ref.actor.optim.lr_scheduler_type=linear", "must be one of constant, cosine"),
    ],
)
def test_what_verl_allows_but_colorl_cannot_honour_is_one_line(base, override, expected):
    key, _, value = override.partition("=")
    node = base.copy()
    with pytest.raises(ConfigError, match=expected) as info:
        OmegaConf.set_struct(node, False)
        OmegaConf.update(node, key, OmegaConf.create({"v": value}).v if value not in ("true",) else True)
        to_config(node)
    assert "\n" not in str(info.value)


def _verl(*overrides):
    micro = "actor_rollout_ref.actor.use_dynamic_bsz=true"  # every phase micro-batches by tokens
    return load_config(["actor_rollout_ref.model.path=/m", "trainer.n_gpus_per_node=2", micro, *overrides])


def test_verls_meanings_where_colorl_used_to_refuse():
    """bypass_mode alone sets the loss; the grouper runs without remove-padding; the ref's sequence-parallel key
    warns as the actor's does; SAPO's +policy_loss.tau_pos/tau_neg are the actor's."""
    cfg = _verl("algorithm.rollout_correction.bypass_mode=true")
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "bypass_mode"
    cfg = _verl("actor_rollout_ref.actor.use_prefix_grouper=true", "actor_rollout_ref.model.use_remove_padding=false")
    assert cfg.actor_rollout_ref.actor.use_prefix_grouper and not cfg.actor_rollout_ref.model.use_remove_padding
    cfg = _verl("actor_rollout_ref.ref.ulysses_sequence_parallel_size=2")
    assert [w.split("=")[0] for w in inert_warnings(cfg)] == ["actor_rollout_ref.ref.ulysses_sequence_parallel_size"]
    cfg = _verl("+actor_rollout_ref.actor.policy_loss.tau_pos=1.5", "+actor_rollout_ref.actor.policy_loss.tau_neg=2.0")
    assert (cfg.actor_rollout_ref.actor.tau_pos, cfg.actor_rollout_ref.actor.tau_neg) == (1.5, 2.0)


def test_older_spellings_and_verls_start_up_derivations():
    cfg = _verl(
        "ray_init.num_cpus=3",
        "critic.model.fsdp_config.param_offload=true",
        "custom_reward_function.path=/r.py",
        "reward_model.enable=true",
        "reward_model.model.path=/rm",
        "actor_rollout_ref.actor.ppo_micro_batch_size=8",
        "actor_rollout_ref.actor.optim.warmup_style=cosine",
        "critic.optim.clip_grad=0.5",
        "actor_rollout_ref.actor.fsdp_config.dtype=float32",
    )
    assert cfg.ray_kwargs.ray_init.num_cpus == 3 and cfg.critic.fsdp.param_offload
    assert (cfg.reward.custom_reward_function.path, cfg.reward.custom_reward_function.name) == (
        "/r.py",
        "compute_score",
    )
    assert cfg.reward.reward_model.enable and cfg.reward.reward_model.model_path == "/rm"
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 4  # verl's global micro-batch ÷ 2 workers
    assert cfg.actor_rollout_ref.actor.optim.lr_scheduler_type == "cosine"
    assert cfg.critic.grad_clip == cfg.critic.optim.clip_grad == 0.5
    assert cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "fp32"
    with pytest.raises(ConfigError, match="set only one"):
        _verl(
            "actor_rollout_ref.actor.ppo_micro_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"
        )
    with pytest.raises(ConfigError, match="one setting under two names"):
        _verl("actor_rollout_ref.actor.grad_clip=0.5", "actor_rollout_ref.actor.optim.clip_grad=2.0")


def test_free_form_sections_take_keys_without_a_plus():
    cfg = _verl(
        "actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4",
        "+actor_rollout_ref.model.override_config.attention_dropout=0.0",
        "data.apply_chat_template_kwargs.enable_thinking=false",
    )
    assert cfg.actor_rollout_ref.rollout.engine_kwargs["vllm"] == {"swap_space": 4}
    assert cfg.actor_rollout_ref.model.override_config == {"attention_dropout": 0.0}
    assert cfg.data.apply_chat_template_kwargs == {"enable_thinking": False}
    assert any(w.startswith("actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4") for w in inert_warnings(cfg))


def test_defaults_are_verl_0_9_1s_and_the_demo_keeps_its_own():
    verl_cfg, demo = _verl(), load_config([])
    assert verl_cfg.actor_rollout_ref.rollout.calculate_log_probs and verl_cfg.trainer.save_freq == -1
    assert verl_cfg.critic.model.use_remove_padding and verl_cfg.trainer.balance_batch
    assert not demo.actor_rollout_ref.rollout.calculate_log_probs and demo.trainer.save_freq == 20
    assert not demo.trainer.balance_batch and demo.actor_rollout_ref.model.use_fused_kernels
