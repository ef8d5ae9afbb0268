"""``python -m trainer.replay RUN_DIR --step K [--stop-before PHASE]``: step K of a recorded run, again, in one process.

The replay starts from the run's newest checkpoint before step K (the run's start when there is none) and runs the
config step K ran under (recorded in the first checkpoint at or after K, else the newest) on to step K, without Ray
(``trainer.use_ray=false``: it works where Ray is not installed) and on one worker, whatever the run had. It
prints step K's metrics beside the logged ones and says whether they are equal (exit 0) or not (exit 1).
``--stop-before PHASE`` enters the debugger (``breakpoint()``) just before that phase of step K, with the step's
``batch`` (a ``DataProto``, the phase's inputs on the driver) and the ``trainer`` in hand.

Nothing is written into ``RUN_DIR``: the start checkpoint is linked (or copied) into a temporary directory, where
the replay writes whatever it writes, and which is removed afterwards. A deterministic run
(``trainer.deterministic=true``) recorded on one worker replays bit-equal; one recorded on N workers replays on one
with the same rows but another reduction order (docs/debugging.md). Keys that measure time or memory, or that
read the run's history (``health/``), are shown but not compared.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from config import ConfigError, PPOConfig, replace_keys, to_config
from config.adapter import installed
from planner import make_plan
from trainer.observing.tracking import read_metrics
from trainer.state.checkpoint import CheckpointError, CheckpointManager, load_driver_state
from trainer.state.fingerprint import config_record

# time, memory and throughput differ from run to run; health/ reads the steps before (not in a checkpoint)
UNCOMPARED = ("timing_s/", "timing_per_token_ms/", "perf/", "health/")


class ReplayError(RuntimeError):
    """What stops a replay before it starts, in one line."""


def compared(key: str) -> bool:
    """Whether a metric is the computation's (compared) rather than the machine's or the history's."""
    return not key.startswith(UNCOMPARED)


def logged_step(run_dir: Path, step: int) -> dict[str, Any]:
    """Step ``step``'s record in ``run_dir/metrics.jsonl``."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise ReplayError(f"{path}: no such file (a run logs it with trainer.logger including 'file')")
    records = {r["step"]: r for r in read_metrics(path) if "step" in r}
    if step not in records:
        raise ReplayError(f"--step {step}: {path} logs steps {min(records, default=0)}..{max(records, default=0)}")
    return records[step]


def replay_config(run_dir: Path, step: int, workdir: Path) -> PPOConfig:
    """The config to replay step ``step`` with, into ``workdir`` (where the start checkpoint is linked)."""
    found = CheckpointManager(str(run_dir), None, None).checkpoints()
    if not found:
        raise ReplayError(
            f"{run_dir}: no checkpoint; a run's config is recorded in its checkpoints (trainer.save_freq)"
        )
    number = {path: int(path.name.rpartition("_")[2]) for path in found}
    before = [p for p in found if number[p] < step]
    at_or_after = [p for p in found if number[p] >= step]
    record = load_driver_state(at_or_after[0] if at_or_after else found[-1])["config"]
    cfg = to_config(_nested(_honoured(record)))
    if before:
        _link_tree(before[-1], workdir / before[-1].name)
    return replace_keys(
        cfg,
        {
            "trainer.default_local_dir": str(workdir),
            "trainer.resume_mode": "auto",
            "trainer.resume_from_path": None,
            "trainer.use_ray": False,
            "trainer.n_gpus_per_node": 1,
            "trainer.nnodes": 1,
            "trainer.save_freq": -1,
            "trainer.test_freq": -1,
            "trainer.val_before_train": False,
            "trainer.logger": ["file"],
            "trainer.rollout_data_dir": None,
            "trainer.validation_data_dir": None,
            "trainer.max_restarts": 0,
        },
    )


class _Reached(Exception):
    """Step K is done: the replay stops the loop there."""


@contextmanager
def replayed(
    run_dir: Path, step: int, phase_hook: Callable[[Any, str, str, Any], None] | None = None
) -> Iterator[dict[str, float]]:
    """Replay ``run_dir`` up to step ``step``; yields that step's metrics (the dict is filled when the step is done).
    ``phase_hook(trainer, "before" | "after", phase, state)`` is called around each phase of step ``step``."""
    from trainer.running import groups
    from trainer.running.build import build_trainer

    metrics: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="colorl-replay-") as workdir:
        cfg = replay_config(run_dir, step, Path(workdir))
        trainer = build_trainer(cfg, make_plan(cfg, 1))
        if trainer.resume_from is not None and trainer.global_step >= step:
            raise ReplayError(f"--step {step}: the replay would start after it ({trainer.resume_from})")
        train_step = trainer.train_step

        def until(batch, more=None):
            result = train_step(batch, more)
            if trainer.global_step == step:
                metrics.update(result)
                raise _Reached
            return result

        trainer.train_step = until
        if phase_hook is not None:
            trainer.step.phase_hook = lambda when, name, state: (
                phase_hook(trainer, when, name, state) if trainer.global_step == step else None
            )
        try:
            trainer.init_workers()
            trainer.fit()
        except _Reached:
            pass
        finally:
            for group in trainer.worker_groups():
                groups.shutdown(group)
        yield metrics


def stop_before(phase: str) -> Callable[[Any, str, str, Any], None]:
    """A phase hook that opens the debugger before ``phase``: ``batch`` and ``trainer`` are its locals."""

    def hook(trainer: Any, when: str, name: str, state: Any) -> None:
        if when == "before" and name == phase:
            batch = state.batch  # noqa: F841 — the phase's inputs, for the person at the prompt
            print(
                f"[colorl] replay: before phase {phase!r} of step {trainer.global_step}: `batch` is its DataProto, "
                "`trainer` the driver; `c` continues",
                flush=True,
            )
            breakpoint()

    return hook


def check_phase(cfg: PPOConfig, phase: str) -> None:
    """``phase`` must be one of the plan's phases (on one worker)."""
    phases = make_plan(cfg, 1).step_phases
    if phase not in phases:
        raise ReplayError(f"--stop-before {phase}: not a phase of this run's step; its phases: {', '.join(phases)}")


def compare(logged: dict[str, Any], replay: dict[str, float]) -> tuple[list[str], list[str]]:
    """(lines of the table of the compared keys, those that differ)."""
    keys = sorted(k for k in logged.keys() & replay.keys() if k != "step" and compared(k))
    width = max((len(k) for k in keys), default=10)
    lines, differ = [f"{'metric':<{width}}  {'logged':>22}  {'replayed':>22}"], []
    for key in keys:
        same = logged[key] == replay[key]
        if not same:
            differ.append(key)
        lines.append(f"{key:<{width}}  {logged[key]:>22.15g}  {replay[key]:>22.15g}  {'=' if same else 'DIFFERS'}")
    return lines, differ


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="the recorded run's trainer.default_local_dir")
    parser.add_argument("--step", type=int, required=True, help="the step to replay")
    parser.add_argument("--stop-before", metavar="PHASE", help="enter the debugger just before this phase of the step")
    args = parser.parse_args(argv)
    try:
        logged = logged_step(args.run_dir, args.step)
        hook = None
        if args.stop_before:
            with tempfile.TemporaryDirectory() as scratch:
                check_phase(replay_config(args.run_dir, args.step, Path(scratch)), args.stop_before)
            hook = stop_before(args.stop_before)
        with replayed(args.run_dir, args.step, hook) as replay:
            pass
    except (ReplayError, ConfigError, CheckpointError) as exc:
        print(f"colorl: replay: {exc}", file=sys.stderr)
        return 2
    lines, differ = compare(logged, replay)
    print("\n".join(lines))
    shown, step = len(lines) - 1, args.step
    if differ:
        print(f"step {step}: the replay differs from the log in {len(differ)} of {shown} metrics: {', '.join(differ)}")
        return 1
    print(f"step {step}: the replay equals the log ({shown} metrics; time, memory and health/ keys not compared)")
    return 0


def _honoured(record: dict[str, Any]) -> dict[str, Any]:
    """The record's keys the installed schema has. A run loaded through a dialect (main.py reads another
    trainer's keys) records that dialect's keys too; those ColoRL's schema lacks change nothing it runs, so the
    replay, which does not import the dialect, leaves them out."""
    known = config_record(installed().schema()())
    return {key: value for key, value in record.items() if key in known}


def _nested(record: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's flat config record (dotted keys) as the nested mapping ``to_config`` builds from."""
    nested: dict[str, Any] = {}
    for key, value in record.items():
        *heads, last = key.split(".")
        node = nested
        for head in heads:
            node = node.setdefault(head, {})
        node[last] = value
    return nested


def _link_tree(source: Path, target: Path) -> None:
    """``source`` at ``target``, each file a hard link where the file system allows (no copy of the weights), else a
    copy: the replay may delete or add files in its directory, never in the recorded run's."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link)


if __name__ == "__main__":
    sys.exit(main())
