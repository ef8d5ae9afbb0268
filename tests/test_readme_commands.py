"""Every command line the README shows runs as written.

The rule for what a user brings: the README names a model as ``~/models/NAME`` and data as ``~/data/NAME/``
(``$HOME/...`` inside a ``key=value`` argument, where the shell does not expand ``~``). The tests give the commands
a fresh home in which every ``~/models/NAME`` the README names is the demo's tiny model and every ``~/data/NAME/``
holds the demo's ``train.parquet`` and ``test.parquet``: the state of a user who ran the README's commands before.

- Each ``python main.py ...`` line of the README's bash blocks (continuations joined, comments dropped, ``$HOME`` and
  a word's leading ``~`` expanded as bash does) runs with ``trainer.dry_run=true`` appended and must exit 0 with no
  traceback. All lines run in one fresh process through ``main.main``: a process a line costs ~7 s of imports each
  on 2 cores, one process for all of them ~12 s.
- The ``separate_async`` line trains for real, 2 steps (~40 s), and generates a step ahead.
- Every ``python -m MODULE`` the README names, in a bash block or in the text, answers ``--help`` (one process).
- Every relative link of the README and of ``docs/`` names a file that exists, and a heading there when it has an
  anchor.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def readme_commands(text: str = README) -> list[str]:
    """The README's shell command lines that run Python, continuations joined and comments dropped."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("python "):
                lines.append(line)
    return lines


def expand(line: str, home: Path) -> list[str]:
    """The words bash passes to ``python``: ``$HOME`` anywhere, ``~`` only at a word's start."""
    words = [w.replace("${HOME}", str(home)).replace("$HOME", str(home)) for w in shlex.split(line)]
    return [str(home) + w[1:] if w == "~" or w.startswith("~/") else w for w in words]


MAIN = [line for line in readme_commands() if line.startswith("python main.py")]
ASYNC = [line for line in MAIN if "separate_async" in line]
HOME_PATH = r"(?:~|\$HOME|\$\{HOME\})/"  # how the README writes a path under the user's home
MODULES = sorted(set(re.findall(r"python -m ([\w.]+)", README)))

# Runs each command line's words (JSON on stdin) through main.main in this one process; prints one JSON result each.
DRY_RUNNER = r"""
import contextlib, io, json, sys, traceback
import main
for argv in json.load(sys.stdin):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main.main(argv)
        except SystemExit as exc:
            status = exc.code
        except BaseException:
            traceback.print_exc()
            status = "raised"
    print(json.dumps({"status": status, "stdout": out.getvalue()[-3000:], "stderr": err.getvalue()[-3000:]}))
"""

HELP_RUNNER = r"""
import contextlib, io, json, runpy, sys
for module in sys.argv[1:]:
    sys.argv = [module, "--help"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            status = 0
        except SystemExit as exc:
            status = exc.code or 0
        except BaseException as exc:
            status = repr(exc)
    print(json.dumps({"module": module, "status": status, "usage": "usage" in out.getvalue().lower()}))
"""


@pytest.fixture(scope="module")
def user_home(tmp_path_factory) -> Path:
    """A home holding every model and data directory the README names: the demo's tiny model and parquet files."""
    from data.builtin import prepare_builtin

    home = tmp_path_factory.mktemp("home")
    assets = prepare_builtin(home / ".assets", num_train=64, num_val=16, sft_warmup_steps=0)
    for name in set(re.findall(HOME_PATH + r"models/([\w.\-]+)", README)):
        (home / "models").mkdir(exist_ok=True)
        (home / "models" / name).symlink_to(assets["model_path"])
    for name in set(re.findall(HOME_PATH + r"data/([\w.\-]+)", README)):
        (home / "data" / name).mkdir(parents=True)
        (home / "data" / name / "train.parquet").symlink_to(assets["train_files"])
        (home / "data" / name / "test.parquet").symlink_to(assets["val_files"])
    return home


def env_for(home: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(home), "WANDB_MODE": "offline", "PYTHONPATH": str(ROOT)}


def python(args: list[str], user_home: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    """``python ARGS`` in the repository, with the README's user home."""
    return subprocess.run(
        [sys.executable, *args],
        input=stdin,
        cwd=ROOT,
        env=env_for(user_home),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def dry_runs(user_home) -> dict[str, dict]:
    """Each README ``python main.py`` line's dry run: its status and output, all in one process."""
    argvs = []
    for line in MAIN:
        argv = expand(line, user_home)[2:]
        argvs.append(argv if "trainer.dry_run=true" in argv else [*argv, "trainer.dry_run=true"])
    out = python(["-c", DRY_RUNNER], user_home, stdin=json.dumps(argvs))
    results = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"status"')]
    assert len(results) == len(MAIN), out.stderr[-3000:]
    return dict(zip(MAIN, results, strict=True))


def test_the_readme_shows_command_lines():
    assert len(MAIN) >= 10 and len(ASYNC) == 1
    assert {"trainer.export", "workers.tools.check_template", "benchmarks.gpu_check"} <= set(MODULES)


@pytest.mark.parametrize("line", MAIN, ids=[f"line{i}" for i in range(len(MAIN))])
def test_a_readme_command_line_checks_and_plans(line, dry_runs):
    result = dry_runs[line]
    assert "Traceback" not in result["stderr"], result["stderr"]
    assert result["status"] == 0, f"{line}\n{result['stderr']}"
    assert "phases" in result["stdout"].lower(), result["stdout"]


def test_the_readme_separate_async_line_trains_a_step_ahead(user_home, tmp_path):
    """Two real steps of the README's line: the second trains on a batch generated under the first step's weights."""
    argv = [*expand(ASYNC[0], user_home), "trainer.total_training_steps=2", f"trainer.default_local_dir={tmp_path}"]
    out = python(argv[1:], user_home)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    rows = [json.loads(row) for row in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    trained = [row for row in rows if "training/off_policy/trajectory_staleness/mean" in row]
    assert [row["step"] for row in trained] == [1, 2]
    assert trained[-1]["training/off_policy/trajectory_staleness/mean"] == 1.0


def test_every_module_the_readme_names_answers_help(user_home):
    out = python(["-c", HELP_RUNNER, *MODULES], user_home)
    results = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"module"')]
    assert [r["module"] for r in results] == MODULES, out.stderr[-3000:]
    assert [r for r in results if r["status"] != 0 or not r["usage"]] == [], out.stderr[-3000:]


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", path.read_text(), flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", DOCS, ids=[p.name for p in DOCS])
def test_every_relative_link_resolves(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"\w+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
            broken.append(target)
    assert broken == [], f"{page.name}: {broken}"
