"""Each of verl's quickstart and example command lines (``commands``) can be dry run: its step's arithmetic and its
memory per worker print, and nothing starts (the dry run itself: tests/trainer/test_dry_run.py)."""

import json

import pytest

from tests.trainer.test_dry_run import QWEN2_5_0_5B
from tests.verl_compat.cli import commands
from trainer.preflight.dry_run import preflight
from verl_compat.cli import load_config, make_plan, num_workers


@pytest.fixture(scope="module")
def qwen_config_dir(tmp_path_factory) -> str:
    """A model directory with only a config.json: all a dry run reads."""
    path = tmp_path_factory.mktemp("qwen2_5_0_5b")
    (path / "config.json").write_text(json.dumps(QWEN2_5_0_5B))
    return str(path)


@pytest.mark.parametrize("name", ["QUICKSTART", "PPO", "GRPO", "GRPO_LORA", "RLOO", "REMAX", "REINFORCE_PP"])
def test_every_verl_command_line_can_be_dry_run(name, qwen_config_dir, capsys):
    cfg = load_config(
        [
            *commands.overrides(getattr(commands, name), model=qwen_config_dir, train="t.parquet", val="v.parquet"),
            "trainer.device=cpu",
            "trainer.dry_run=true",
        ]
    )
    with pytest.raises(SystemExit) as exit_:
        preflight(cfg, make_plan(cfg, num_workers(cfg)), demo_config=None)
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    update_actor = next(line.split() for line in out.splitlines() if line.split()[:1] == ["update_actor"])
    assert update_actor[1] == str(cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n // 2)
    assert "peak: " in out and ("critic:" in out) == (cfg.algorithm.adv_estimator == "gae")
