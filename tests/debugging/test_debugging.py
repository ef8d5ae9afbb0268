"""One process, no Ray: a Ray-free run bit-equal to Ray's, a replayed step equal to the log, and ``trainer.diff``
naming the step and phase where a changed learning rate parts two runs (real tiny demo runs, reused). The runs
without Ray run as on a bare PyTorch image (``bare_image/``): what they import beyond it is docs/gpu.md's table."""

import json
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from config import ConfigError
from planner import load_config, make_plan
from trainer.replay import ReplayError, check_phase, compared
from trainer.running.groups import uses_ray

REPO = Path(__file__).resolve().parents[2]
BARE = Path(__file__).parent / "bare_image"  # a sitecustomize that hides Ray, datasets and matplotlib
STEPS = 5


def tiny(run_dir: Path, assets: Path) -> list[str]:
    return [
        f"builtin.cache_dir={assets}",
        "builtin.hidden_size=32",
        "builtin.num_train=16",
        "builtin.num_val=4",
        "data.train_batch_size=4",
        "data.max_response_length=5",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "algorithm.adv_estimator=grpo",
        "trainer.n_gpus_per_node=1",
        "trainer.device=cpu",
        f"trainer.total_training_steps={STEPS}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.save_freq=1",
        "trainer.deterministic=true",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[file]",
    ]


IMAGE = ("torch", "transformers", "peft", "safetensors", "pytest")  # a bare PyTorch image, with what these require
BEYOND_IMAGE = {"hydra-core", "omegaconf", "antlr4-python3-runtime", "pyarrow"}  # docs/gpu.md's table
# the project (installed editable); mimalloc's loader, which its .pth imports at start-up where installed (optional)
NOT_COUNTED = {"colorl", "cmeel"}


def run(
    args: list[str], ray: bool, imported: Path | None = None, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python ARGS`` in the repository (``extra`` added to its environment); without ``ray`` as on a bare
    PyTorch image, which writes into ``imported`` the distributions of what it imported."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HYDRA_FULL_ERROR": "0"}
    env.update(extra or {})
    env["PYTHONPATH"] = str(REPO) if ray else os.pathsep.join([str(BARE), str(REPO)])
    if imported is not None:
        imported.mkdir(exist_ok=True)
        env["COLORL_BARE_REPORT"] = str(imported)
    done = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    return done


def train(keys: list[str], ray: bool, imported: Path | None = None) -> str:
    done = run(["main.py", *keys], ray, imported)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A: as on a bare PyTorch image (no Ray, no datasets, no matplotlib); B: the same on Ray."""
    root = tmp_path_factory.mktemp("debugging")
    a, b = root / "a", root / "b"
    (root / "a.log").write_text(train(tiny(a, root / "assets"), ray=False, imported=root / "imported"))
    train(tiny(b, root / "assets"), ray=True)
    return a, b


def imported(run_dir: Path) -> Path:
    return run_dir.parent / "imported"


@pytest.fixture(scope="module")
def changed_lr(runs):
    """C: B's checkpoint of step 4 resumed with another actor learning rate (the planted divergence)."""
    b = runs[1]
    c = b.parent / "c"
    shutil.copytree(b, c, ignore=shutil.ignore_patterns(f"global_step_{STEPS}", ".colorl.lock"))
    (c / "latest_checkpointed_iteration.txt").write_text(str(STEPS - 1))
    train([*tiny(c, b.parent / "assets"), "actor_rollout_ref.actor.optim.lr=1e-4"], ray=False)
    return c


def metrics(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if compared(k)} for r in records]


def test_a_run_without_ray_is_bit_equal_to_the_ray_run(runs):
    a, b = runs
    assert len(metrics(a)) == STEPS and metrics(a) == metrics(b)
    weights = f"global_step_{STEPS}/actor/__0_0.distcp"
    assert (a / weights).read_bytes() == (b / weights).read_bytes()


@pytest.fixture(scope="module")
def replay_3(runs):
    """B's step 3 replayed with ``--stop-before update_actor``: a breakpoint hook notes what the debugger had."""
    b = runs[1]
    seen, before = b.parent / "breakpoints.jsonl", sorted(p.name for p in b.rglob("*"))
    args = ["-m", "trainer.replay", str(b), "--step", "3", "--stop-before", "update_actor"]
    hook = {"PYTHONBREAKPOINT": "tests.debugging.breakpoint_hook.record", "COLORL_BREAKPOINT_LOG": str(seen)}
    done = run(args, ray=False, imported=imported(b), extra=hook)
    assert sorted(p.name for p in b.rglob("*")) == before  # nothing written into the recorded run
    return done, [json.loads(line) for line in seen.read_text().splitlines()] if seen.exists() else []


def test_a_replayed_step_equals_the_logged_one_without_ray(replay_3):
    done, _ = replay_3
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "step 3: the replay equals the log" in done.stdout


def test_stop_before_enters_the_debugger_with_the_steps_batch(runs, replay_3):
    """Once, before update_actor of step 3, with that step's 4 prompts × 2 responses, scored and with advantages."""
    done, seen = replay_3
    assert [(s["phase"], s["step"], s["rows"]) for s in seen] == [("update_actor", 3, 8)], done.stdout[-2000:]
    assert {"responses", "attention_mask", "advantages", "token_level_scores"} <= set(seen[0]["tensors"])
    assert "raw_prompt" in seen[0]["non_tensors"]
    assert "actor/pg_loss" not in seen[0]["metrics"]  # before the update, not after it
    assert "before phase 'update_actor' of step 3: `batch` is its DataProto" in done.stdout
    logged = next(m for m in metrics(runs[1]) if m["training/global_step"] == 3)
    assert seen[0]["score_mean"] == pytest.approx(logged["critic/score/mean"], abs=1e-6)


@pytest.mark.slow  # a third run and two replays: ~1 min on 2 cores
def test_diff_names_the_step_and_phase_of_a_changed_learning_rate(runs, changed_lr):
    b, c = runs[1], changed_lr
    done = run(["-m", "trainer.diff", str(b), str(c), "--tensors"], ray=False, imported=imported(b))
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"step {STEPS}: the runs part" in done.stdout
    assert "config actor_rollout_ref.actor.optim.lr: A 0.0003, B 0.0001" in done.stdout
    assert f"step {STEPS}, phase 'update_actor'" in done.stdout, done.stdout[-2000:]


def test_diff_finds_nothing_between_equal_runs(runs):
    a, b = runs
    done = run(["-m", "trainer.diff", str(a), str(b)], ray=False, imported=imported(a))
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "agree on every step" in done.stdout


def test_configs_a_single_process_cannot_run_are_refused_naming_the_key():
    cfg = load_config(["trainer.use_ray=false", "trainer.n_gpus_per_node=2", "trainer.device=cpu"])
    with pytest.raises(ConfigError, match=r"trainer.n_gpus_per_node=2 × trainer.nnodes=1: trainer.use_ray=false"):
        uses_ray(cfg, make_plan(cfg, 2))
    with pytest.raises(ReplayError, match="--stop-before nope: not a phase .* its phases: .*update_actor"):
        check_phase(cfg, "nope")


def test_without_matplotlib_a_run_skips_the_plot_in_one_line(runs):
    a, b = runs
    lines = [line for line in (a.parent / "a.log").read_text().splitlines() if "reward_curve.png" in line]
    assert lines == ["colorl: reward_curve.png skipped: matplotlib is not installed (pip install matplotlib draws it)"]
    assert not (a / "reward_curve.png").exists() and (b / "reward_curve.png").stat().st_size > 0


def _required(names: tuple[str, ...]) -> set[str]:
    """The distributions ``names`` need, and those they need, as installed here (no extras)."""
    seen, todo = set(), list(names)
    while todo:
        name = _normal(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue
        requirements = [Requirement(r) for r in requires]
        todo += [r.name for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})]
    return seen


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_a_bare_pytorch_image_needs_only_the_packages_of_the_table(runs):
    """Training, and the replays and diffs of the tests before this one: docs/gpu.md's table is all they import
    beyond the image."""
    found = {}
    for report in imported(runs[0]).glob("*.json"):
        found.update(json.loads(report.read_text()))
    beyond = {_normal(d) for d in found} - _required(IMAGE) - NOT_COUNTED
    assert "torch" in found and beyond == BEYOND_IMAGE
