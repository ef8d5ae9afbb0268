"""``distillation.*``: accepted, checked in one line, and a teacher that is not a causal LM or lacks the student's
vocabulary is refused before any model loads (verl's keys of the teacher's server and of the loss:
tests/verl_compat/cli/test_verl_teacher.py)."""

import pytest
from transformers import DistilBertConfig

from config import ConfigError
from config.distillation import active_teachers
from data.builtin import build_char_tokenizer, tiny_model_config
from planner import load_config, make_plan, num_workers
from trainer.preflight.dry_run import check_models

ON = ["distillation.enabled=true"]


def model_dir(path, extra_tokens=(), causal=True):
    """A model directory with a config and a tokenizer (no weights: nothing here loads them)."""
    tokenizer = build_char_tokenizer()
    tokenizer.add_tokens(list(extra_tokens))
    (tiny_model_config(tokenizer) if causal else DistilBertConfig()).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_the_keys_load_with_their_defaults():
    cfg = load_config([])
    loss = cfg.distillation.distillation_loss
    assert not cfg.distillation.enabled and cfg.distillation.teacher_key == "data_source"
    assert (loss.loss_mode, loss.topk, loss.use_policy_gradient, loss.loss_max_clamp) == ("k3", 32, False, None)


def test_several_teachers_are_keyed():
    teachers = [
        "+distillation.teacher_models.math.model_path=/models/a",
        "+distillation.teacher_models.math.key=openai/gsm8k",
        "+distillation.teacher_models.code.model_path=/models/b",
    ]
    with pytest.raises(ConfigError, match=r"distillation\.teacher_models\.code\.key=null: with several teachers"):
        load_config(ON + teachers)
    cfg = load_config([*ON, *teachers, "+distillation.teacher_models.code.key=code"])
    assert sorted(active_teachers(cfg.distillation)) == ["code", "math"]  # verl drops teacher_model then
    with pytest.raises(ConfigError, match=r"teachers share the key\(s\) \['x'\]"):
        load_config(
            [*ON, *teachers[:1], teachers[2], "+distillation.teacher_models.math.key=x"]
            + ["+distillation.teacher_models.code.key=x"]
        )


def test_loss_mistakes_are_one_line():
    with pytest.raises(ConfigError, match=r"distillation\.teacher_models\.teacher_model\.model_path=null"):
        load_config(ON)
    with pytest.raises(ConfigError, match=r"distillation\.distillation_loss\.loss_mode='k1': backpropagated directly"):
        load_config(["distillation.distillation_loss.loss_mode=k1"])
    load_config(
        ["distillation.distillation_loss.loss_mode=k1", "distillation.distillation_loss.use_policy_gradient=true"]
    )
    with pytest.raises(ConfigError, match=r"distillation_loss\.topk=null: loss_mode=forward_kl_topk needs"):
        load_config(
            ["distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=null"]
        )


def test_a_teacher_must_be_a_causal_lm_with_the_students_vocabulary(tmp_path):
    student = model_dir(tmp_path / "student")
    same = model_dir(tmp_path / "same")
    other_vocab = model_dir(tmp_path / "other", extra_tokens=["<think>"])
    encoder = model_dir(tmp_path / "encoder", causal=False)

    def check(teacher, *extra):
        cfg = load_config(
            [
                *ON,
                f"actor_rollout_ref.model.path={student}",
                f"distillation.teacher_models.teacher_model.model_path={teacher}",
                *extra,
            ],
            "demo",  # the demo's batch settings with these models
        )
        check_models(cfg, make_plan(cfg, num_workers(cfg)))

    check(same)
    with pytest.raises(ConfigError) as raised:
        check(other_vocab)
    assert str(raised.value).startswith(f"distillation.teacher_models.teacher_model.model_path='{other_vocab}': its ")
    assert "(49 tokens) differs from the student's (48 tokens" in str(raised.value) and "'<think>'" in str(raised.value)
    with pytest.raises(ConfigError, match=r"'distilbert' model is not a causal LM; the teacher needs one"):
        check(encoder)
    with pytest.raises(ConfigError, match=r"model_path='/no/such/teacher': no such directory"):
        check("/no/such/teacher")
    with pytest.raises(ConfigError, match=r"distillation_loss\.topk=49: more than the vocabulary's 48 tokens"):
        check(
            same, "distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=49"
        )


def _plan(*overrides, n_workers=2):
    return make_plan(load_config(list(overrides)), n_workers)


def test_the_step_runs_the_teacher_phase_only_with_distillation_on():
    """Off: no teacher phase, and the update reads no teacher key. On: the teacher scores after the KL phases, and
    what it writes stays on the workers for the update (the sampled tokens' log-probs, or k values a token)."""
    off = _plan()
    assert not off.compute_teacher and "teacher" not in [p.name for p in off.flows["step"].phases]
    assert not any(k.startswith("teacher") for k in off.flows["step"].route("update_actor").reads)
    teacher = ["distillation.teacher_models.teacher_model.model_path=/models/teacher"]
    on = _plan(*ON, *teacher, "actor_rollout_ref.actor.use_kl_loss=true")
    names = [p.name for p in on.flows["step"].phases]
    assert on.compute_teacher and names.index("ref") < names.index("teacher") < names.index("update_actor")
    route = on.flows["step"].route("teacher")
    assert (route.keep, route.give, route.columns) == (("teacher_log_probs",), (), ())
    assert on.flows["step"].route("update_actor").fetch[-1:] == ("teacher_log_probs",)
    topk = _plan(*ON, *teacher, "distillation.distillation_loss.loss_mode=forward_kl_topk")
    assert topk.flows["step"].route("teacher").keep == ("teacher_topk_ids", "teacher_topk_log_probs")
    assert "teacher" not in [p.name for p in topk.flows["validation"].phases]


def test_with_dynamic_sampling_the_teacher_scores_the_kept_rows():
    """The teacher phase follows filter_groups: the sequences it reads come back to it from the driver."""
    plan = _plan(
        *ON,
        "distillation.teacher_models.teacher_model.model_path=/models/teacher",
        "algorithm.filter_groups.enable=true",
        "data.gen_batch_size=32",
    )
    names = [p.name for p in plan.flows["step"].phases]
    assert names.index("filter_groups") < names.index("teacher")
    assert "responses" in plan.flows["step"].route("teacher").send


def test_several_teachers_route_rows_by_the_teacher_key_column():
    plan = _plan(
        *ON,
        "+distillation.teacher_models.math.model_path=/models/a",
        "+distillation.teacher_models.math.key=openai/gsm8k",
        "+distillation.teacher_models.code.model_path=/models/b",
        "+distillation.teacher_models.code.key=mbpp",
    )
    assert plan.flows["step"].route("teacher").columns == ("data_source",)


def test_the_teachers_forward_needs_the_rollouts_log_prob_micro_batch():
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.rollout\.log_prob_micro_batch_size_per_gpu=null"):
        make_plan(
            load_config(
                [
                    *ON,
                    "distillation.teacher_models.teacher_model.model_path=/models/teacher",
                    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=null",
                    "actor_rollout_ref.actor.skip_on_policy_old_log_prob=true",
                ]
            ),
            2,
        )
