"""benchmarks.opd_race: the held-out problems it validates on, the numbers it reads from a run's metrics, and (slow)
both modes on tiny models of the arithmetic problems (a student and another model as its teacher)."""

import pyarrow.parquet as pq
import pytest

from benchmarks.opd_race import held_out, problem, race_summary
from data.builtin import build_tiny_model
from data.preprocess.arith import make_splits, write_splits
from tests.benchmarks.runner import run_benchmark
from tests.data.gsm8k_fixture import printable_tokenizer, save_tiny_model

STRICT = "val-core/colorl/arith/reward/mean@1"


def test_held_out_problems_are_calculations_no_training_row_has(tmp_path):
    """Another seed's problems repeat many training calculations in other stories: those are dropped."""
    train = write_splits(make_splits({"train": 300}, seed=0), tmp_path / "train")["train"]
    other = write_splits(make_splits({"test": 100}, seed=1), tmp_path / "other")["test"]
    kept = held_out(str(other), str(train), tmp_path / "heldout.parquet")
    rows = pq.read_table(tmp_path / "heldout.parquet").to_pylist()
    seen = {problem(row) for row in pq.read_table(train).to_pylist()}
    assert 0 < kept == len(rows) < 100 and not any(problem(row) in seen for row in rows)
    assert problem(rows[0]) == rows[0]["extra_info"]["answer"].split(" = ")[0]  # "13 - 7", not the story


def test_race_summary_reads_accuracy_steps_and_the_teachers_time():
    rows = [
        {"step": 0, "_minute": 1.0, STRICT: 0.1},
        {"step": 1, "_minute": 2.0, "timing_s/step": 10.0, "timing_s/teacher": 1.0, "distillation/loss": 0.8},
        {"step": 2, "_minute": 3.0, "timing_s/step": 12.0, "timing_s/teacher": 2.0, "distillation/loss": 0.4},
        {"step": 2, "_minute": 3.5, STRICT: 0.5, "perf/cpu_memory_peak_gb": 1.5},
    ]
    out = race_summary(rows, gain=0.3)
    assert out["strict_gain"] == 0.4 and out["strict_gain_per_minute"] == 0.16 and out["first_minute_at_gain"] == 3.5
    assert out["steps"] == 2 and out["s_per_step_mean"] == 11.0 and out["teacher_s_per_step_mean"] == 1.5
    assert out["distillation_loss_first_last"] == [0.8, 0.4]


@pytest.fixture(scope="module")
def tiny_task(tmp_path_factory):
    """A student and a larger teacher with one printable-character tokenizer, the problems of seed 0 (the
    teacher's) and of seed 1 (held out)."""
    root = tmp_path_factory.mktemp("opd_race")
    student = save_tiny_model(root / "student", printable_tokenizer())
    tokenizer = printable_tokenizer()
    tokenizer.save_pretrained(root / "teacher")
    build_tiny_model(tokenizer, hidden_size=24, num_layers=1, max_position_embeddings=512, seed=2).save_pretrained(
        root / "teacher"
    )
    write_splits(make_splits({"train": 16, "test": 4}, seed=0), root / "data")
    heldout = write_splits(make_splits({"test": 40}, seed=1), root / "heldout")["test"]
    tiny = ["data.train_batch_size=2", "data.max_prompt_length=448", "data.max_response_length=4"]
    tiny += ["data.val_max_samples=4", "data.val_batch_size=4", "actor_rollout_ref.rollout.n=2"]
    tiny += ["actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"]
    tiny += ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8", "trainer.test_freq=2"]
    tiny += ["trainer.total_training_steps=2", "distillation.distillation_loss.topk=8"]
    common = ["--model-path", student, "--teacher-path", str(root / "teacher"), "--data-dir", str(root / "data")]
    return [*common, *(f"--set={o}" for o in tiny)], str(heldout)


@pytest.mark.slow  # two runs of main.py and the teacher's evaluation: about 2 minutes
def test_the_race_runs_grpo_and_opd_and_evaluates_the_teacher(tiny_task):
    args, heldout = tiny_task
    out = run_benchmark("opd_race", "race", *args, "--heldout", heldout, "--minutes", "5", timeout=900)
    assert 0 < out["heldout_rows"] < 40 and 0 <= out["teacher"]["accuracy"] <= 1 and out["teacher"]["rows"] == 4
    assert out["grpo"]["steps"] == out["opd"]["steps"] == 2 and len(out["opd"]["curve"]) == 2
    assert out["opd"]["teacher_s_per_step_mean"] > 0 and out["grpo"]["teacher_s_per_step_mean"] is None
    assert out["opd"]["distillation_loss_first_last"][0] > 0


@pytest.mark.slow  # two trainers, a step each: about a minute
def test_the_cost_of_the_teacher_is_measured_on_the_same_samples(tiny_task):
    args, _ = tiny_task
    out = run_benchmark("opd_race", "cost", *args, "--steps", "2", "--warmup", "1", timeout=900)
    with_t, without = out["with_teacher"], out["without_teacher"]
    assert "teacher" in with_t["timing_s"] and "teacher" not in without["timing_s"]
    assert with_t["response_length_mean"] == without["response_length_mean"]  # frozen weights: the same samples
    assert out["teacher_s_per_step"] > 0 and out["teacher_weights_mb_per_worker"] > 0
