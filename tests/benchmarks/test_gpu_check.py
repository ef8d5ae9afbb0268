"""benchmarks.gpu_check: each part in its own process and log; a missing module, a failure or a timeout is said
and the next part still runs; the GRPO runs' figures must be finite."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import gpu_check
from benchmarks.gpu_check import Part, read_grpo, run_part

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # ~34 s, the phases it runs: tests/fake_cuda on meta
def test_quick_cpu_check_without_ray_writes_a_summary_and_the_logs(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.gpu_check",
            "--out",
            str(tmp_path),
            "--device",
            "cpu",
            "--quick",
            "--no-ray",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    parts = summary["parts"]
    assert list(parts) == ["model", "data", "dry_run", "memory", "floor", "grpo_hf", "grpo_vllm", "gpu_tests"]
    assert parts["floor"]["status"] == "skipped: --no-ray"
    assert parts["gpu_tests"]["status"].startswith("skipped: --device cpu")
    for name in ("dry_run", "memory", "grpo_hf"):  # the parts that need no Ray ran (GRPO without it), with logs
        assert parts[name]["status"] == "ok", parts[name]
        assert (tmp_path / parts[name]["log"]).read_text().startswith("$ ")
    assert parts["dry_run"]["figures"]["peak_gib"] > 0
    assert parts["memory"]["figures"]["peak_rss_compute_mb"] > 0
    assert summary["failed"] == [] and summary["environment"]["device"] == "cpu"
    assert "summary.json" in done.stdout.splitlines()[-1]


def test_without_ray_the_grpo_runs_run_in_one_process_instead_of_being_skipped(tmp_path):
    args = gpu_check.parse_args(["--out", str(tmp_path), "--no-ray", "--quick", "--device", "cpu"])
    by_name = {part.name: part for part in gpu_check.parts(args, tmp_path)}
    for name in ("grpo_hf", "grpo_vllm", "dry_run"):
        assert "trainer.use_ray=false" in by_name[name].argv and "trainer.n_gpus_per_node=1" in by_name[name].argv
    assert not by_name["grpo_hf"].ray and "ray" not in by_name["grpo_hf"].needs
    assert by_name["floor"].ray  # benchmarks.floor drives Ray workers
    with_ray = {p.name: p for p in gpu_check.parts(gpu_check.parse_args(["--out", str(tmp_path)]), tmp_path)}
    assert with_ray["grpo_hf"].ray and "trainer.use_ray=false" not in with_ray["grpo_hf"].argv


def test_a_missing_module_is_a_skip_and_a_failure_or_timeout_does_not_stop_the_next_part(tmp_path):
    absent = Part("absent", ["-c", "pass"], 30, needs=("colorl_no_such_module",))
    assert run_part(absent, tmp_path, no_ray=False)["status"] == "skipped: needs colorl_no_such_module"
    assert not (tmp_path / "absent.log").exists()
    deep = Part("deep", ["-c", "import colorl_no_such_module.sub"], 30)  # a need found only by running
    assert run_part(deep, tmp_path, no_ray=False)["status"] == "skipped: needs colorl_no_such_module"
    assert "ModuleNotFoundError" in (tmp_path / "deep.log").read_text()
    fails = Part("fails", ["-c", "raise SystemExit(3)"], 30)
    assert run_part(fails, tmp_path, no_ray=False)["status"] == "failed: exit status 3"
    hang = "import subprocess, sys, time; print(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
    hangs = Part("hangs", ["-c", f"{hang}.pid, flush=True); time.sleep(60)"], 3)  # and a process it started
    result = run_part(hangs, tmp_path, no_ray=False)
    assert result["status"] == "failed: timed out after 3 s" and result["seconds"] < 30
    child = int((tmp_path / "hangs.log").read_text().split()[-1])  # its stdout, kept in the log
    assert _ended(child)
    assert run_part(Part("ray", ["-c", "pass"], 30, ray=True), tmp_path, no_ray=True)["status"] == "skipped: --no-ray"
    old_run = tmp_path / "run"
    (old_run / "metrics.jsonl").parent.mkdir()
    (old_run / "metrics.jsonl").write_text("{}\n")  # an earlier check's run, which main.py would refuse to mix into
    assert run_part(Part("clears", ["-c", "pass"], 30, clears=old_run), tmp_path, no_ray=False)["status"] == "ok"
    assert not old_run.exists()
    reads = Part("reads", ["-c", "print(7)"], 30, read=lambda out: ({"x": int(out)}, [] if int(out) < 5 else ["x>=5"]))
    assert run_part(reads, tmp_path, no_ray=False) | {"seconds": 0} == {
        "status": "failed: x>=5",
        "seconds": 0,
        "log": "reads.log",
        "figures": {"x": 7},
    }


def test_a_spent_budget_skips_the_parts_left(tmp_path):
    assert gpu_check.main(["--out", str(tmp_path), "--device", "cpu", "--quick", "--budget-s", "0"]) == 0
    parts = json.loads((tmp_path / "summary.json").read_text())["parts"]
    assert parts["dry_run"]["status"] == parts["memory"]["status"] == "skipped: --budget-s 0 spent"
    assert parts["grpo_vllm"]["status"] == "skipped: --quick"  # a reason of its own stands
    assert not list(tmp_path.glob("*.log"))


def _ended(pid: int) -> bool:
    """Whether process ``pid`` is gone (or a zombie, killed and not yet reaped) within 10 s."""
    for _ in range(100):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def _metrics(run_dir: Path, *steps: dict) -> None:
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": i + 1, **s}) + "\n" for i, s in enumerate(steps))
    )


def test_grpo_figures_must_be_finite_and_both_steps_logged(tmp_path):
    good = {key: 0.5 for key in gpu_check.FINITE} | {"perf/max_memory_allocated_gb": 1.5}
    _metrics(tmp_path / "good", good, good)
    figures, problems = read_grpo(tmp_path / "good", 2)("")
    assert problems == [] and figures["perf/max_memory_allocated_gb"] == 1.5 and figures["steps"] == 2
    _metrics(tmp_path / "nan", good, good | {"training/rollout_probs_diff_mean": float("nan")})
    assert read_grpo(tmp_path / "nan", 2)("")[1] == ["step 2: training/rollout_probs_diff_mean = nan"]
    _metrics(tmp_path / "short", {k: v for k, v in good.items() if k != "actor/pg_loss"})
    assert read_grpo(tmp_path / "short", 2)("")[1] == ["1 step(s) logged, 2 expected", "step 1: actor/pg_loss = None"]


@pytest.mark.slow
def test_quick_cpu_check_with_ray_runs_the_floor_and_two_grpo_steps(tmp_path):
    """The Ray parts on CPU: the floor and two GRPO steps of main.py with the hf rollout (minutes under load)."""
    assert gpu_check.main(["--out", str(tmp_path), "--device", "cpu", "--quick", "--budget-s", "3600"]) == 0
    parts = json.loads((tmp_path / "summary.json").read_text())["parts"]
    assert parts["floor"]["figures"]["decode_tokens_per_s"] > 0
    assert parts["grpo_hf"]["status"] == "ok" and parts["grpo_hf"]["figures"]["steps"] == 2
