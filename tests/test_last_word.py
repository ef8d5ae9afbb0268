"""What ``python main.py`` shows its user, read from the captured output of a real short run of the demo: a bar over
the budget that ends the run, no progress bars for sub-second work and no Ray notices that ask nothing, and a last
word that says why the run ended, what validation reached and where the results are."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer.running.console import BudgetBar, continue_argv, last_word, quiet_ray_init_kwargs

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wall_time_run(tmp_path_factory):
    """The demo with a wall-time budget and no step count (as the learning race and the tools preset run)."""
    out = tmp_path_factory.mktemp("run")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "HF_HUB_DISABLE"))}
    args = [
        "trainer.total_training_steps=null",
        "trainer.max_wall_time_s=6",
        "trainer.save_freq=2",
        "trainer.test_freq=2",
        f"trainer.default_local_dir={out}",
    ]
    result = subprocess.run(
        [sys.executable, str(REPO / "main.py"), *args], cwd=out, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out, args, result.stdout + result.stderr


def test_the_run_ends_with_why_what_validation_reached_and_where_everything_is(wall_time_run):
    out, args, text = wall_time_run
    word = text[text.index("colorl: run ended:") :]
    assert "wall-time budget ran out (trainer.max_wall_time_s=6)" in word
    steps = int(re.search(r"steps: (\d+) done in \dm \d\ds", word).group(1))
    assert steps >= 1 and " of 100" not in word  # no step count: none is shown
    assert re.search(r"val-core/colorl/copy/reward/mean@1: [\d.]+ at step 0, best [\d.]+ at step \d+", word)
    paths = dict(re.findall(r"^  (checkpoint|report|metrics): (\S+)$", word, re.M))
    assert set(paths) == {"checkpoint", "report", "metrics"} and all(Path(p).exists() for p in paths.values())
    assert Path(paths["checkpoint"]).parent == out and Path(paths["report"]).name == "report.html"
    assert f"continue (resumes from the last checkpoint): python main.py {' '.join(args)}" in word
    assert f"python -m trainer.export {out} --out <dir>" in word


def test_the_bar_counts_the_wall_time_budget_and_nothing_sub_second_or_idle_prints(wall_time_run):
    _, _, text = wall_time_run
    bars = [line for line in re.split(r"[\r\n]", text) if line.startswith("copy_demo:")]
    assert bars and all("/0.1 min (trainer.max_wall_time_s), step " in bar for bar in bars), bars[-3:]
    assert "steps [" not in text and "/100000" not in text
    assert "Loading weights" not in text  # the workers' model loading: under a second
    assert "Token authentication" not in text and "Started a local Ray instance" not in text


def test_rays_own_logging_variables_turn_its_notices_back_on(monkeypatch):
    monkeypatch.delenv("RAY_LOGGER_LEVEL", raising=False)
    monkeypatch.delenv("RAY_LOGGING_CONFIG_ENCODING", raising=False)
    assert quiet_ray_init_kwargs() == {"logging_level": 30}
    monkeypatch.setenv("RAY_LOGGER_LEVEL", "info")
    assert quiet_ray_init_kwargs() == {}


def test_a_run_without_checkpoints_says_so_instead_of_a_command():
    word = last_word("done: step 2 reached", 2, 2, 75.0, [{"step": 1}], {"checkpoint": None}, "/runs/x", argv=[])
    assert "steps: 2 of 2 done in 1m 15s" in word and "checkpoint: none" in word
    assert "set trainer.save_freq > 0" in word and "continue (" not in word


def test_the_bar_shows_the_budget_that_runs_out_first():
    """A step count far beyond the wall-time budget (the learning race's 100,000 steps) counts minutes; steps that
    finish well within the budget count steps; no budget: steps."""

    def bar(total_steps, budget_s, seconds_per_step, steps=2):
        started = time.monotonic() - seconds_per_step * steps  # the steps so far took this long
        shown = BudgetBar("run", total_steps, budget_s, started=started)
        shown.update(steps)
        shown.close()
        return shown.bar.bar_format  # what tqdm draws after the bar

    assert bar(100_000, 1680, 10).endswith("0.3/28.0 min (trainer.max_wall_time_s), step 2")
    assert bar(10, 1680, 10).endswith("2/10 steps [00:20<01:20]")
    assert bar(10, None, 10).endswith("2/10 steps [00:20<01:20]")


def test_the_command_that_continues():
    """Same arguments under resume_mode=auto; a run that did its steps gets more of them."""
    assert continue_argv(["a=1"], None, "auto") == ["a=1"]
    assert continue_argv(["trainer.total_training_steps=2", "a=1"], 2, "auto") == [
        "a=1",
        "trainer.total_training_steps=4",
    ]
    assert continue_argv(["trainer.resume_mode=disable"], None, "disable") == ["trainer.resume_mode=auto"]


@pytest.mark.slow  # a run of its own (~35 s)
def test_a_run_the_nan_guard_stops_ends_with_its_last_word_then_its_error(tmp_path):
    """The demo at a learning rate that makes step 2's losses NaN, the guard at 1 step: the last word says why,
    names the checkpoint of step 1, and the error line follows it (exit status 1)."""
    args = [
        "trainer.total_training_steps=4",
        "trainer.max_nonfinite_steps=1",
        "actor_rollout_ref.actor.optim.lr=1e30",
        "trainer.save_freq=1",
        f"trainer.default_local_dir={tmp_path}",
    ]
    result = subprocess.run(
        [sys.executable, str(REPO / "main.py"), *args], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 1, result.stderr[-3000:]
    word = result.stdout[result.stdout.index("colorl: run ended:") :]
    assert word.startswith("colorl: run ended: the NaN guard stopped it (1 steps in a row")
    checkpoint = Path(re.search(r"^  checkpoint: (\S+)$", word, re.M)[1])
    assert checkpoint.is_dir() and checkpoint.parent == tmp_path
    assert "had NaN/inf losses or gradients" in result.stderr.strip().splitlines()[-1]
