"""Generation dumps (verl's trainer.rollout_data_dir / validation_data_dir / log_val_generations) and the report's
samples, from real multi-turn rollout rows (tests/trainer/report_fixtures.py)."""

import json

import pytest

from planner import load_config
from tests.trainer.report_fixtures import REWARDS
from tests.wandb_offline import run_file
from trainer.observing.generations import GenerationLog, pick_samples, read_generations, write_generations
from trainer.observing.tracking import Tracking

VERL_FIELDS = ["input", "output", "gts", "score", "step"]


@pytest.fixture
def tokenizer(chat_tokenizer_):
    return chat_tokenizer_


@pytest.fixture
def step(rollout):
    return rollout


def trainer_config(tmp_path, *overrides):
    return load_config([f"trainer.default_local_dir={tmp_path / 'run'}", *overrides]).trainer


def test_the_rollout_dump_holds_every_response_in_verls_layout(tmp_path, tokenizer, step):
    batch, prompts, extras = step
    log = GenerationLog(trainer_config(tmp_path, f"trainer.rollout_data_dir={tmp_path / 'dump'}"), tokenizer)
    log.training_step(batch, prompts, extras, 7)
    (path,) = (tmp_path / "dump").iterdir()
    assert path.name == "7.jsonl"  # verl's file name: the step
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == len(batch)
    for i, record in enumerate(records):
        assert list(record)[:5] == VERL_FIELDS  # verl's fields first, then the reward function's extras
        assert record["step"] == 7 and record["score"] == REWARDS[i] and record["acc"] == (REWARDS[i] > 0)
        assert record["input"] == tokenizer.decode(prompts[0][i], skip_special_tokens=True)  # verl decodes so
        assert record["output"] == tokenizer.decode(batch.batch["responses"][i], skip_special_tokens=True)
    assert [r["gts"] for r in records] == ["42", "42", "5", "5"]
    assert [r["clipped"] for r in records] == [False, False, False, True]
    assert [r["tool_error_counts"] for r in records] == [0, 1, 0, 0]
    roles = [m["role"] for m in records[0]["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant"] and records[0]["messages"][2]["content"] == "42"


def test_sampled_rows_carry_their_tokens_as_training_saw_them(tmp_path, tokenizer, step):
    batch, prompts, extras = step
    log = GenerationLog(trainer_config(tmp_path, "trainer.report.samples_per_step=3"), tokenizer)
    log.training_step(batch, prompts, extras, 7)
    samples = read_generations(tmp_path / "run" / "samples" / "train")[7]
    # the best and the worst reward, the one cut at the limit (the tool error's row is the worst's group mate)
    assert len(samples) == 3 and {s["clipped"] for s in samples} == {True, False}
    for sample in samples:
        row = [r["output"] for r in read_all(batch, tokenizer)].index(sample["output"])
        length = int(batch.batch["attention_mask"][row, -batch.batch["responses"].shape[-1] :].sum())
        assert sample["token_ids"] == batch.batch["responses"][row, :length].tolist()
        assert "".join(sample["tokens"]) == tokenizer.decode(sample["token_ids"])
        assert sample["trained"] == batch.batch["response_mask"][row, :length].tolist()
        assert sample["advantages"] == pytest.approx(batch.batch["advantages"][row, :length].tolist(), rel=1e-3)
        assert sample["log_probs"] == pytest.approx(batch.batch["rollout_log_probs"][row, :length].tolist(), abs=1e-3)
    tool_row = next(s for s in samples if s["tool_call_counts"])
    masked = "".join(t for t, trained in zip(tool_row["tokens"], tool_row["trained"]) if not trained)
    assert tool_row["messages"][2]["content"] in masked  # the tool's answer is a masked turn


def read_all(batch, tokenizer):
    width = batch.batch["responses"].shape[-1]
    return [
        {"output": tokenizer.decode(r[m.bool()], skip_special_tokens=True)}
        for r, m in zip(batch.batch["responses"], batch.batch["attention_mask"][:, -width:])
    ]


def test_pick_samples_takes_the_extremes_first_then_a_group():
    rewards, uids = [0.5, 0.9, 0.1, 0.5, 0.5, 0.5], ["a", "a", "b", "b", "c", "c"]
    clipped, errors = [False, False, False, False, True, False], [0, 0, 0, 0, 0, 3]
    picked = pick_samples(rewards, clipped, errors, uids, k=5, seed=0)
    assert picked[:4] == [1, 2, 4, 5] and len(set(picked)) == 5
    assert pick_samples(rewards, clipped, errors, uids, k=2, seed=0) == [1, 2]
    assert pick_samples(rewards, clipped, errors, uids, k=6, seed=1)[:4] == [1, 2, 4, 5]
    assert pick_samples([], [], [], [], k=3, seed=0) == [] and pick_samples(rewards, clipped, errors, uids, 0, 0) == []


def test_validation_dumps_and_log_val_generations_print_and_log_a_wandb_table(tmp_path, tokenizer, step, capsys):
    batch, prompts, extras = step
    cfg = trainer_config(tmp_path, f"trainer.validation_data_dir={tmp_path / 'val'}", "trainer.log_val_generations=2")
    logger = Tracking("p", "e", ["console", "wandb"], {}, str(tmp_path / "run"), total_steps=2)
    log = GenerationLog(cfg, tokenizer)
    half = len(batch) // 2
    parts = [
        (batch[:half], (prompts[0][:half], prompts[1][:half]), {"reward": REWARDS[:half], "acc": [True, False]}),
        (batch[half:], (prompts[0][half:], prompts[1][half:]), {"reward": REWARDS[half:], "acc": [True, False]}),
    ]
    for i, part in enumerate(parts):  # each validation batch is routed under its own step token
        part[0].meta_info = {"step_token": f"token-{i}"}
    log.validation(parts, 0, logger)
    log.validation(parts, 2, logger)
    logger.finish()
    records = read_generations(tmp_path / "val")
    assert sorted(records) == [0, 2] and len(records[2]) == len(batch)
    assert [r["reward"] for r in records[2]] == REWARDS and [r["acc"] for r in records[2]] == [True, False] * 2
    captured = capsys.readouterr()
    printed = captured.out + captured.err
    assert printed.count("[val sample 1/2 step 2") == 1 and printed.count("[val sample 2/2 step 0") == 1
    run = run_file(tmp_path / "run", logger.wandb_run_id)
    # the table as wandb saved it at each validation (its media files: the run's history is written asynchronously)
    tables = [json.loads(p.read_text()) for p in (run.parent / "files" / "media" / "table").rglob("*.table.json")]
    table = max(tables, key=lambda t: len(t["data"]))
    # verl's layout: one row per validation, the step and then each sample's input, output and score
    assert table["columns"] == ["step", "input_1", "output_1", "score_1", "input_2", "output_2", "score_2"]
    assert [row[0] for row in table["data"]] == [0, 2] and table["data"][0][1:] == table["data"][1][1:]
    samples = {tuple(table["data"][1][i : i + 3]) for i in (1, 4)}
    assert samples <= {(r["input"], r["output"], r["score"]) for r in records[2]}


def test_a_resumed_run_drops_what_an_earlier_attempt_wrote_after_its_checkpoint(tmp_path, tokenizer):
    cfg = trainer_config(tmp_path, f"trainer.rollout_data_dir={tmp_path / 'dump'}")
    for step in (1, 2, 3):
        write_generations(tmp_path / "dump", step, [{"step": step}])
        write_generations(tmp_path / "run" / "samples" / "train", step, [{"step": step}])
    (tmp_path / "dump" / "notes.jsonl").write_text("kept\n")
    GenerationLog(cfg, tokenizer).drop_steps_after(0)  # a fresh run: only its own samples go
    assert sorted(read_generations(tmp_path / "dump")) == [1, 2, 3]
    assert read_generations(tmp_path / "run" / "samples" / "train") == {}
    write_generations(tmp_path / "run" / "samples" / "train", 3, [{"step": 3}])
    GenerationLog(cfg, tokenizer).drop_steps_after(2)
    assert sorted(read_generations(tmp_path / "dump")) == [1, 2] and (tmp_path / "dump" / "notes.jsonl").exists()
    assert read_generations(tmp_path / "run" / "samples" / "train") == {}


def test_a_partial_line_is_skipped_when_reading(tmp_path):
    write_generations(tmp_path, 4, [{"a": 1}, {"a": 2}])
    with open(tmp_path / "4.jsonl", "a") as f:
        f.write('{"a": 3, "cut sh')
    assert read_generations(tmp_path) == {4: [{"a": 1}, {"a": 2}]}
