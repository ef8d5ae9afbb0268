"""A worker SIGKILLed or hung in the middle of ``update_actor``, in a real run of ``main.py`` (a child process).

Each run: the tiny GRPO demo on 2 CPU workers, a checkpoint every step, the fault on rank 1 at step 2.
"""

import json

import pytest

from tests.reliability.conftest import REPO, run_child, tiny_overrides
from trainer.running.watchdog import EXIT_HUNG
from trainer.state.checkpoint import check_checkpoint
from trainer.state.ledger import FILE as LEDGER

FAULT_RUN = str(REPO / "tests" / "reliability" / "fault_run.py")


def logged_steps(run_dir) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # a minute of Ray runs: make test keeps under its 20 minutes
def test_dead_worker_is_reported_and_everything_torn_down(tmp_path, assets):
    run = run_child([FAULT_RUN, "kill", "1", "2", *tiny_overrides(tmp_path, assets)], cwd=tmp_path)
    assert run.returncode == 1, run.stderr[-3000:]
    message = [line for line in run.stderr.splitlines() if line.startswith("colorl: ")]
    assert len(message) == 1 and "worker rank 1 of 2 died during actor_rollout.update_actor: pid " in message[0]
    assert "on node " in message[0] and "Traceback" not in run.stderr
    assert run.survivors() == []
    check_checkpoint(tmp_path / "global_step_1")  # the step before the death is kept


@pytest.mark.slow  # ~47 s: a separate_async run until its rollout worker dies (one line, teardown: the test above)
def test_a_dead_rollout_worker_is_reported_and_both_groups_torn_down(tmp_path, assets):
    """separate_async: the rollout group's worker dies generating the third batch (asked for at step 2); as in sync
    mode, one line names it, every process of both groups is gone, the last checkpoint is intact."""
    separate = ["trainer.n_gpus_per_node=1", "trainer.v1.trainer_mode=separate_async"]
    separate += ["trainer.v1.separate_async.parameter_sync_step=1", "actor_rollout_ref.rollout.nnodes=1"]
    separate += ["actor_rollout_ref.rollout.n_gpus_per_node=1"]
    run = run_child([FAULT_RUN, "kill-rollout", "0", "3", *tiny_overrides(tmp_path, assets), *separate], cwd=tmp_path)
    assert run.returncode == 1, run.stderr[-3000:]
    message = [line for line in run.stderr.splitlines() if line.startswith("colorl: ")]
    assert (
        len(message) == 1
        and "worker rank 0 of 1 died during ActorRolloutRefWorker.generate_sequences: pid " in (message[0])
    ), run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    assert run.survivors() == []
    check_checkpoint(tmp_path / "global_step_1")


@pytest.mark.slow  # a training run until a worker dies: ~40 s (a dead worker's one line: the test above)
def test_out_of_memory_in_a_worker_is_one_line_naming_rank_node_and_keys(tmp_path, assets):
    run = run_child([FAULT_RUN, "oom", "1", "2", *tiny_overrides(tmp_path, assets)], cwd=tmp_path)
    assert run.returncode == 1, run.stderr[-3000:]
    message = [line for line in run.stderr.splitlines() if line.startswith("colorl: ")]
    assert len(message) == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert "View the dashboard" not in run.stderr  # ray_init.include_dashboard defaults to false
    assert message[0].startswith(
        "colorl: worker rank 1 of 2 raised OutOfMemoryError during actor_rollout.update_actor: pid "
    )
    assert message[0].endswith(
        "CUDA out of memory. Tried to allocate 20.00 GiB; out of memory: lower "
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (ppo_max_token_len_per_gpu with "
        "use_dynamic_bsz)"
    )
    assert run.survivors() == []
    check_checkpoint(tmp_path / "global_step_1")


@pytest.mark.slow  # two worker start-ups: ~90 s on 2 loaded cores
def test_dead_worker_is_replaced_and_the_run_completes(tmp_path, assets):
    overrides = [*tiny_overrides(tmp_path, assets), "trainer.max_restarts=1"]
    run = run_child([FAULT_RUN, "kill", "1", "2", *overrides], cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "restart 1 of 1 (trainer.max_restarts)" in run.stderr
    assert f"resumed from {tmp_path / 'global_step_1'} (step 1)" in run.stdout
    assert logged_steps(tmp_path) == [1, 2]  # step 2, cut short by the death, computed once more and only it
    ledger = [json.loads(line) for line in (tmp_path / LEDGER).read_text().splitlines()]
    assert [line["step"] for line in ledger] == [1, 2]  # the restart's step 2 once in the ledger too
    trained = [(line["epoch"], i) for line in ledger for i in line["trained"]]
    assert trained and len(trained) == len(set(trained))  # no prompt trained twice across the restart
    check_checkpoint(tmp_path / "global_step_2")
    assert run.survivors() == []


@pytest.mark.slow  # waits out the watchdog's timeout: ~55 s (the watchdog's logic: tests/reliability/test_watchdog.py)
def test_hang_dumps_every_stack_and_exits_with_the_checkpoint_intact(tmp_path, assets):
    overrides = [*tiny_overrides(tmp_path, assets), "trainer.phase_timeout_s=20"]
    run = run_child([FAULT_RUN, "hang", "1", "2", *overrides], cwd=tmp_path)
    assert run.returncode == EXIT_HUNG, run.stderr[-3000:]
    assert "colorl: hang: phase 'update_actor' passed its 20 s deadline" in run.stderr
    assert "waiting on actor_rollout.update_actor at rank(s) [" in run.stderr
    rank0, rank1 = run.stderr.split("--- rank 0")[1].split("--- rank 1")
    assert "fault_run.py" in rank1 and "fault_run.py" not in rank0  # the hung rank's own frame
    assert "--- driver (main thread) ---" in run.stderr
    check_checkpoint(tmp_path / "global_step_1")
    assert logged_steps(tmp_path) == [1]
    assert run.survivors() == []
