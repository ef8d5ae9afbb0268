"""verl's ``model.override_config``: the Hugging Face config attributes replaced when the policy and the critic
load (``+actor_rollout_ref.model.override_config.attention_dropout=0.0`` in verl's scripts)."""

from types import SimpleNamespace

from workers.compute.critic import load_value_model
from workers.roles.fsdp_workers import load_causal_lm


def test_override_config_replaces_the_models_config_attributes(tiny_model_dir):
    model_cfg = SimpleNamespace(
        path=tiny_model_dir,
        trust_remote_code=False,
        enable_gradient_checkpointing=False,
        override_config={"rms_norm_eps": 0.125},
    )
    assert load_causal_lm(model_cfg).config.rms_norm_eps == 0.125
    assert load_value_model(tiny_model_dir, False, {"rms_norm_eps": 0.25}).config.rms_norm_eps == 0.25
    assert load_value_model(tiny_model_dir).config.rms_norm_eps != 0.25
