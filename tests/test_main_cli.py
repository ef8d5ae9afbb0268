"""``python main.py`` with a bad config: one line on stderr, exit status 2, no traceback, no Ray or model work."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "args, expected",
    [
        (["data.foo=1"], ["unknown config key 'data.foo'"]),
        (
            ["data.train_batch_size=7", "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.n=1"],
            ["data.train_batch_size=7", "actor_rollout_ref.rollout.n=1", "2 workers"],
        ),
    ],
)
def test_config_error_exits_with_one_line(tmp_path, args, expected):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    result = subprocess.run(
        [sys.executable, str(REPO / "main.py"), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("colorl: config error: ")
    assert len(result.stderr.strip().splitlines()) == 1
    for part in expected:
        assert part in result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written in the working directory


def _main(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(
        [sys.executable, str(REPO / "main.py"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


# a value's range (the schema), and the step plan's check of the estimator (the algorithms' registry)
@pytest.mark.parametrize(
    "args", [["data.train_batch_size=0"], ["algorithm.adv_estimator=grpo_passk", "actor_rollout_ref.rollout.n=1"]]
)
def test_a_config_error_is_reported_without_importing_torch(tmp_path, args):
    """Loading, checking and planning a config (the registries' metadata included) needs no torch: a mistake is
    said in well under the seconds torch takes to import."""
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); import main; status = main.main({args!r}); "
        "print(status, 'torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=os.environ
    )
    assert result.stdout.split() == ["2", "False"], result.stderr
    assert result.stderr.startswith("colorl: config error: ") and len(result.stderr.strip().splitlines()) == 1


def test_lora_targets_that_match_no_layer_are_one_line_before_anything_loads(tmp_path):
    """The pre-flight memory estimate builds the adapters (on the meta device) before any model loads: a target
    that names no layer ends there, in one line naming the key, the value and the model's layer names."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    args = ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.target_modules=[no_such_proj]"]
    result = _main([*args, f"trainer.default_local_dir={out}", f"builtin.cache_dir={cache}"], tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("colorl: config error: actor_rollout_ref.model.target_modules=['no_such_proj']")
    assert "match no layer of the model; its layers are named" in result.stderr and "q_proj" in result.stderr
    assert not out.exists() and not cache.exists()  # no run directory, no demo assets: nothing was built
