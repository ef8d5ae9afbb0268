"""``python -m trainer.diff RUN_A RUN_B [--tensors] [--rtol R]``: where two runs part, down to the phase.

It reads both runs' ``metrics.jsonl`` and prints the first step whose compared metrics (``trainer.replay.compared``:
not time, memory or health/) differ beyond ``R``: ``|a - b| > R · max(|a|, |b|)`` (0, the default: bit-equal), with
the metrics that do, and the config keys in which the runs differ (the configs recorded in their newest
checkpoints; ``trainer.default_local_dir`` left out). With ``--tensors`` it then replays that step of both runs
(``trainer.replay``: without Ray, one worker) and compares each phase's outputs on the driver key by key: the
batch's tensors the phase wrote and the metrics it gave. It names the first phase whose outputs part, with the
largest difference and where it is (row, token). Exit 0: the runs agree; 1: they part.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from config import ConfigError
from trainer.observing.tracking import read_metrics
from trainer.replay import ReplayError, compared, replayed
from trainer.state.checkpoint import CheckpointError, CheckpointManager, load_driver_state

PhaseOutputs = list[tuple[str, dict[str, torch.Tensor]]]  # (phase, {batch key or "metric:<key>": value}) in order


def parts(a: float, b: float, rtol: float) -> bool:
    """Whether two values differ beyond ``rtol`` (relative to the larger magnitude; 0: any difference)."""
    return abs(a - b) > rtol * max(abs(a), abs(b)) or (a != a) != (b != b)


def first_parting_step(run_a: Path, run_b: Path, rtol: float) -> tuple[int | None, list[tuple[str, float, float]]]:
    """(the first step both runs logged whose compared metrics part, those metrics with their two values)."""
    a, b = (_records(run) for run in (run_a, run_b))
    for step in sorted(a.keys() & b.keys()):
        keys = sorted(k for k in a[step].keys() & b[step].keys() if k != "step" and compared(k))
        differ = [(k, a[step][k], b[step][k]) for k in keys if parts(a[step][k], b[step][k], rtol)]
        if differ:
            return step, differ
    return None, []


def config_differences(run_a: Path, run_b: Path) -> list[tuple[str, Any, Any]]:
    """The config keys whose values differ between the runs' newest checkpoints' records."""
    a, b = (_config(run) for run in (run_a, run_b))
    missing = "<absent>"
    keys = sorted((a.keys() | b.keys()) - {"trainer.default_local_dir"})
    return [(k, a.get(k, missing), b.get(k, missing)) for k in keys if a.get(k, missing) != b.get(k, missing)]


def phase_outputs(run_dir: Path, step: int) -> PhaseOutputs:
    """Replay step ``step`` of ``run_dir`` and keep what each of its phases left on the driver."""
    captured: PhaseOutputs = []
    before: dict[str, Any] = {}

    def hook(trainer: Any, when: str, name: str, state: Any) -> None:
        tensors = dict(state.batch.batch.items()) if state.batch.batch is not None else {}
        if when == "before":
            before.update(tensors=tensors, metrics=dict(state.metrics))
            return
        out = {key: t.detach().cpu().clone() for key, t in tensors.items() if before["tensors"].get(key) is not t}
        for key, value in state.metrics.items():
            if compared(key) and (key not in before["metrics"] or before["metrics"][key] is not value):
                out[f"metric:{key}"] = torch.as_tensor(value, dtype=torch.float64).detach().cpu().clone()
        captured.append((name, out))

    with replayed(run_dir, step, hook):
        pass
    return captured


def first_parting_phase(a: PhaseOutputs, b: PhaseOutputs, rtol: float) -> str | None:
    """The line naming the first phase whose outputs part, with the key, its largest difference and where."""
    for (phase, out_a), (_, out_b) in zip(a, b):
        for key in sorted(out_a.keys() | out_b.keys()):
            if key not in out_a or key not in out_b:
                return f"phase {phase!r}: {key} is an output of one run only"
            x, y = out_a[key], out_b[key]
            if x.shape != y.shape:
                return f"phase {phase!r}: {key} has shape {tuple(x.shape)} in A and {tuple(y.shape)} in B"
            gap = (x.double() - y.double()).abs()
            scale = torch.maximum(x.double().abs(), y.double().abs())
            beyond = (gap > rtol * scale) | (torch.isnan(x.double()) != torch.isnan(y.double()))
            if beyond.any():
                worst = int(torch.where(beyond, gap.nan_to_num(float("inf")), -1.0).argmax())
                where = _where(worst, tuple(x.shape))
                return (
                    f"phase {phase!r}: {key} parts first; largest |difference| {gap.flatten()[worst].item():.6g}"
                    f"{where} (A {x.flatten()[worst].item():.9g}, B {y.flatten()[worst].item():.9g})"
                )
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.diff", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--tensors", action="store_true", help="replay the first parting step of both runs")
    parser.add_argument("--rtol", type=float, default=0.0, help="relative tolerance (default 0: bit-equal)")
    args = parser.parse_args(argv)
    try:
        step, differ = first_parting_step(args.run_a, args.run_b, args.rtol)
        config = config_differences(args.run_a, args.run_b)
        for key, a, b in config:
            print(f"config {key}: A {a!r}, B {b!r}")
        if step is None:
            print(f"the runs' metrics agree on every step both logged (rtol {args.rtol:g})")
            return 0
        print(f"step {step}: the runs part in {len(differ)} metrics (rtol {args.rtol:g}):")
        for key, a, b in differ:
            print(f"  {key}: A {a:.9g}, B {b:.9g}")
        if args.tensors:
            line = first_parting_phase(phase_outputs(args.run_a, step), phase_outputs(args.run_b, step), args.rtol)
            print(f"step {step}, {line}" if line else f"step {step}: every phase's outputs agree when replayed")
    except (ReplayError, ConfigError, CheckpointError) as exc:
        print(f"colorl: diff: {exc}", file=sys.stderr)
        return 2
    return 1


def _records(run: Path) -> dict[int, dict[str, Any]]:
    path = run / "metrics.jsonl"
    if not path.exists():
        raise ReplayError(f"{path}: no such file (a run logs it with trainer.logger including 'file')")
    return {r["step"]: r for r in read_metrics(path) if "step" in r}


def _config(run: Path) -> dict[str, Any]:
    found = CheckpointManager(str(run), None, None).checkpoints()
    if not found:
        raise ReplayError(f"{run}: no checkpoint, so no recorded config (trainer.save_freq)")
    return load_driver_state(found[-1])["config"]


def _where(flat_index: int, shape: tuple[int, ...]) -> str:
    """`` at (row r, token t)`` of a flat index into a (rows, tokens) tensor; `` at row r`` of a vector."""
    if len(shape) == 2:
        return f" at (row {flat_index // shape[1]}, token {flat_index % shape[1]})"
    if len(shape) == 1:
        return f" at row {flat_index}"
    return f" at index {flat_index}" if shape else ""


if __name__ == "__main__":
    sys.exit(main())
