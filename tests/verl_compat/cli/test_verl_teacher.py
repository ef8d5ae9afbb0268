"""verl's keys of a distillation teacher's own inference server and resource pool: they load with verl's defaults
and a value away from one warns in one line (ColoRL's teacher is colocated: a frozen FSDP role on every worker);
verl's loss key of the distillation takes only the one loss verl supports there."""

import pytest

from verl_compat.cli import ConfigError, load_config
from verl_compat.cli.inert import teacher_warnings


def test_the_teachers_server_and_pool_keys_load_and_warn_when_set():
    cfg = load_config(
        [
            "distillation.enabled=true",
            "distillation.teacher_models.teacher_model.model_path=/models/teacher",
            "distillation.distillation_loss.loss_mode=forward_kl_topk",
            "distillation.distillation_loss.topk=8",
            "distillation.distillation_loss.use_task_rewards=false",
            "distillation.distillation_loss.log_prob_min_clamp=-10",
            "distillation.distillation_loss.loss_max_clamp=10",
            "distillation.distillation_loss.clip_ratio_high=0.28",
            "distillation.n_gpus_per_node=4",
            "distillation.nnodes=1",
            "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size=4",
        ]
    )
    assert cfg.distillation.distillation_loss.topk == 8
    warnings = teacher_warnings(cfg.distillation)
    assert len(warnings) == 3 and all("colocated" not in w or "ColoRL" in w for w in warnings)
    assert any(
        w.startswith("distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size=4")
        for w in warnings
    )


def test_the_distillation_policy_loss_is_ppos_clipped_one_only():
    assert load_config([]).distillation.distillation_loss.policy_loss_mode == "vanilla"
    with pytest.raises(ConfigError, match=r"distillation_loss\.policy_loss_mode='gspo': must be one of vanilla"):
        load_config(["distillation.distillation_loss.policy_loss_mode=gspo"])
