"""Every command line the README shows runs as written.

Each ``python main.py ...`` line of the README's bash blocks (continuations joined, comments dropped) runs with
``trainer.dry_run=true`` appended, in a fresh process whose home is empty:

- a line that needs only the built-in demo (it names no model or data of its own) must check and plan cleanly;
- a line that names a model or data the user brings (``/path/to/...``, ``~/models/...``, a preset reading them)
  must stop in one line naming the missing path, never with a traceback.

``python -m`` lines must at least answer ``--help``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """The README's shell command lines that run Python, continuations joined and comments dropped."""
    text = (ROOT / "README.md").read_text()
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("python "):
                lines.append(line)
    return lines


def run(argv: list[str], home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(home), "WANDB_MODE": "offline"}
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def brings_its_own(line: str) -> bool:
    """Whether the line names a model or data the user brings (a path, or a preset that reads one)."""
    return "/path/to/" in line or "~/" in line or "--config-name" in line or ".parquet" in line


MAIN = [line for line in readme_commands() if line.startswith("python main.py")]
MODULES = sorted({shlex.split(line)[2] for line in readme_commands() if line.startswith("python -m ")})


def test_the_readme_shows_command_lines():
    assert len(MAIN) >= 8 and any("separate_async" in line for line in MAIN)
    assert "trainer.export" in MODULES


@pytest.mark.parametrize("line", MAIN, ids=[f"line{i}" for i in range(len(MAIN))])
def test_a_readme_command_line_checks_and_plans(line, tmp_path):
    argv = [sys.executable, *shlex.split(line.replace("~/", f"{tmp_path}/"))[1:], "trainer.dry_run=true"]
    argv = [
        a if a != "trainer.default_local_dir=outputs/fresh" else f"trainer.default_local_dir={tmp_path}/fresh"
        for a in argv
    ]
    out = run(argv, tmp_path)
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    if brings_its_own(line):
        assert out.returncode != 0 and out.stderr.strip().splitlines()[-1].startswith("colorl:"), out.stderr[-2000:]
    else:
        assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.slow  # a process per module, each importing torch
@pytest.mark.parametrize("module", MODULES)
def test_a_readme_module_answers_help(module, tmp_path):
    out = run([sys.executable, "-m", module, "--help"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
