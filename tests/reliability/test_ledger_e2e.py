"""The run's ledger of what was trained (trainer/state/ledger.py) over real runs of ``main.py`` (child processes):
an epoch interrupted by SIGKILL and resumed trains every prompt exactly once, in sync mode, on another worker count
(elastic resume) and in ``separate_async``; a ledger edited by hand is refused in one line.

The tiny demo with 16 prompts and 4 a step: an epoch is 4 steps. The run is SIGKILLed (its whole process group) at
step 3, after its ledger line was written and before any save of the step; the checkpoint is step 2's; the resumed
run computes step 3 again and goes on into the second epoch.
"""

import json
from pathlib import Path

import pytest

from tests.reliability.conftest import REPO, run_child
from trainer.state.ledger import FILE

KILL_RUN = str(REPO / "tests" / "reliability" / "kill_run.py")
MAIN = str(REPO / "main.py")
SEPARATE_ASYNC = [  # the README's line, on one CPU worker for each group
    "trainer.v1.trainer_mode=separate_async",
    "actor_rollout_ref.rollout.nnodes=1",
    "trainer.v1.separate_async.parameter_sync_step=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "trainer.use_ray=true",
]


def keys(run_dir: Path, assets: Path, steps: int, *extra: str) -> list[str]:
    """16 prompts, 4 a step, one CPU worker without Ray (unless ``extra`` says otherwise), a checkpoint every 2."""
    return [
        f"builtin.cache_dir={assets}",
        "builtin.hidden_size=32",
        "builtin.num_train=16",
        "builtin.num_val=4",
        "builtin.sft_warmup_steps=2",
        "data.train_batch_size=4",
        "data.max_response_length=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "algorithm.adv_estimator=grpo",
        "trainer.n_gpus_per_node=1",
        "trainer.device=cpu",
        "trainer.use_ray=false",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=2",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={run_dir}",
        *extra,
    ]


def ledger(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / FILE).read_text().splitlines()]


def killed_and_resumed(
    run_dir: Path, assets: Path, *extra: str, resume_with: tuple[str, ...] = ()
) -> tuple[list[dict], str]:
    """SIGKILLed at step 3, then resumed to step 6 (with ``resume_with`` in place of the keys it names): the ledger
    (its step 3 checked before the resume) and the last word."""
    run_dir.mkdir()
    killed = run_child([KILL_RUN, "3", *keys(run_dir, assets, 6, *extra)], cwd=run_dir)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert [line["step"] for line in ledger(run_dir)][-1] == 3  # step 3's line, which no checkpoint holds
    replaced = {override.partition("=")[0] for override in resume_with}
    again = [o for o in keys(run_dir, assets, 6, *extra) if o.partition("=")[0] not in replaced]
    resumed = run_child([MAIN, *again, *resume_with], cwd=run_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {run_dir / 'global_step_2'} (step 2)" in resumed.stdout
    return ledger(run_dir), resumed.stdout


def assert_every_prompt_once(lines: list[dict]) -> None:
    """Steps 1-6 once each; epoch 0's 16 prompts each drawn once and trained once, epoch 1's 8 drawn so far too
    (in separate_async, up to 2 batches generated ahead: drawn, not trained yet)."""
    assert sorted({line["step"] for line in lines}) == [1, 2, 3, 4, 5, 6]
    assert len({(line["step"], line["epoch"]) for line in lines}) == len(lines)
    for epoch, size in ((0, 16), (1, None)):
        drawn = [i for line in lines if line["epoch"] == epoch for i in line["drawn"]]
        trained = [i for line in lines if line["epoch"] == epoch for i in line["trained"]]
        assert len(drawn) == len(set(drawn)) and len(trained) == len(set(trained)), (epoch, drawn, trained)
        assert set(trained) <= set(drawn)
        if size is not None:
            assert sorted(drawn) == sorted(trained) == list(range(size))
    assert sum(len(line["trained"]) for line in lines) == 6 * 4  # 4 prompts a step, none lost


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory) -> tuple[Path, list[dict], str, Path]:
    run_dir, assets = tmp_path_factory.mktemp("ledger") / "run", tmp_path_factory.mktemp("assets")
    return run_dir, *killed_and_resumed(run_dir, assets), assets


def test_an_epoch_killed_and_resumed_trains_every_prompt_once(sync_run):
    _, lines, last_word, _ = sync_run
    assert_every_prompt_once(lines)
    assert "  epoch 0: trained 16 of 16, filtered 0, dropped 0\n" in last_word
    assert "  epoch 1: trained 8 of 16, filtered 0, dropped 0 (8 not drawn yet)\n" in last_word


def test_a_ledger_edited_by_hand_is_refused_in_one_line(sync_run):
    run_dir, lines, _, assets = sync_run
    path = run_dir / FILE
    text = path.read_text().splitlines()
    first = json.loads(text[0])
    first["trained"] = first["trained"][1:]  # "this prompt never trained"
    path.write_text("\n".join([json.dumps(first), *text[1:]]) + "\n")
    refused = run_child([MAIN, *keys(run_dir, assets, 8)], cwd=run_dir)
    assert refused.returncode == 1, refused.stderr[-3000:]
    message = [line for line in refused.stderr.splitlines() if line.startswith("colorl: ")]
    assert message == [
        f"colorl: {path} line 1 does not match checkpoint {run_dir / 'global_step_6'} (changed since step 6 was "
        "saved): restore the file as it was, or resume from another checkpoint (trainer.resume_from_path)"
    ], refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr
    assert path.read_text().splitlines()[1:] == text[1:]  # nothing was changed


@pytest.mark.slow  # two separate_async runs with Ray (~60 s on 2 loaded cores)
def test_separate_async_killed_and_resumed_trains_every_prompt_once(tmp_path, tmp_path_factory):
    lines, last_word = killed_and_resumed(tmp_path / "run", tmp_path_factory.mktemp("assets"), *SEPARATE_ASYNC)
    assert_every_prompt_once(lines)
    assert "  epoch 0: trained 16 of 16, filtered 0, dropped 0\n" in last_word


@pytest.mark.slow  # a run of two workers with Ray after the one-worker run (~40 s on 2 loaded cores)
def test_an_epoch_killed_on_one_worker_and_resumed_on_two_trains_every_prompt_once(tmp_path, tmp_path_factory):
    two = ("trainer.n_gpus_per_node=2", "trainer.use_ray=true")
    lines, last_word = killed_and_resumed(tmp_path / "run", tmp_path_factory.mktemp("assets"), resume_with=two)
    assert_every_prompt_once(lines)
    assert "  epoch 0: trained 16 of 16, filtered 0, dropped 0\n" in last_word
