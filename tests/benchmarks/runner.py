"""How the benchmark tests run a benchmark: ``python -m benchmarks.<name>`` at tiny sizes, one JSON object out."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "--hidden",
    "32",
    "--layers",
    "1",
    "--sft-warmup-steps",
    "0",
    "--prompts",
    "2",
    "--n",
    "2",
    "--prompt-length",
    "8",
    "--response-length",
    "4",
    "--device",
    "cpu",
]
R = 4  # --response-length


def run_benchmark(name: str, *args: str, timeout: float = 240) -> dict:
    """``python -m benchmarks.<name> args``: its stdout must be exactly one JSON object."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout
    out = json.loads(lines[0])
    assert out["benchmark"] == name
    device = args[args.index("--device") + 1] if "--device" in args else "cpu"
    assert out["machine"]["device"] == device and len(out["machine"]["loadavg"]) == 3
    return out
