"""The algorithm names on the command line: unknown ones listed against the valid ones, the ones ColoRL cannot run
yet refused with the reason, each in one line before anything starts; and the plan's phases read off the registries."""

import pytest

import algos
from config import ConfigError
from planner import load_config, make_plan


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        ("algorithm.adv_estimator", algos.ADV_ESTIMATORS),
        ("actor_rollout_ref.actor.policy_loss.loss_mode", algos.POLICY_LOSSES),
        ("actor_rollout_ref.actor.loss_agg_mode", algos.LOSS_AGG_MODES),
    ],
)
def test_unknown_name_lists_the_valid_ones(key, valid):
    with pytest.raises(ConfigError) as err:
        load_config([f"{key}=nope"])
    message = str(err.value)
    assert "\n" not in message and f"{key}='nope'" in message
    assert all(name in message for name in valid)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode"], "calculate_log_probs"),
        (["algorithm.rollout_correction.bypass_mode=true"], "calculate_log_probs"),
        (["algorithm.rollout_correction.rollout_is=token"], "calculate_log_probs"),
        (["algorithm.adv_estimator=gdpo"], "algorithm.gdpo_reward_keys=null"),
        (
            ["algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[a,b]", "algorithm.gdpo_reward_weights=[1]"],
            "one weight per key",
        ),
        (["actor_rollout_ref.actor.policy_loss.loss_mode=dro"], "policy_loss.dro_beta=null"),
        (["actor_rollout_ref.actor.policy_loss.clip_cov_ratio=0"], "clip_cov_ratio=0"),
        (["algorithm.adv_estimator=grpo_passk", "actor_rollout_ref.rollout.n=1"], "rollout.n > 1"),
    ],
)
def test_refused_in_one_line(overrides, expected):
    with pytest.raises(ConfigError, match=expected) as err:
        load_config(overrides)
    assert "\n" not in str(err.value)


def test_clip_ratio_alone_warns_that_it_changes_nothing():
    with pytest.warns(UserWarning, match="clip_ratio=0.3 is not used"):
        cfg = load_config(["actor_rollout_ref.actor.clip_ratio=0.3"])
    assert (cfg.actor_rollout_ref.actor.clip_ratio_low, cfg.actor_rollout_ref.actor.clip_ratio_high) == (0.2, 0.2)


def test_the_plan_runs_the_phases_the_registries_ask_for():
    def plan(*overrides):
        return make_plan(load_config(list(overrides)), 2)

    assert plan("algorithm.adv_estimator=remax").compute_greedy_baseline
    assert not plan("algorithm.adv_estimator=grpo").compute_greedy_baseline
    otb = plan("algorithm.adv_estimator=optimal_token_baseline")
    assert otb.compute_sum_pi_squared and otb.recompute_old_log_prob  # even for one on-policy optimizer step
    assert not plan("algorithm.adv_estimator=grpo").recompute_old_log_prob
    assert plan("algorithm.adv_estimator=gae").use_critic and not plan("algorithm.adv_estimator=opo").use_critic
    critic = load_config(["algorithm.adv_estimator=gae"]).critic
    assert critic.loss_scale_factor is None and critic.loss_agg_mode == "token-mean"  # the actor's, as in verl
