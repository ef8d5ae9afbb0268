"""Import each of the given modules first, each in a process of its own; print one JSON line of the failures.

``python tests/fresh_imports.py MODULE ...`` (from the repository root). Starting a Python process per module would
import torch, Ray and transformers each time (seconds apiece), so this process imports the third-party modules
that the project's code names (and nothing of the project), then forks one child per module: the child starts
with none of the project's modules loaded, exactly as a fresh interpreter does, and imports its module first.
An import cycle inside the project (a module that works only after another was imported) fails its child.
"""

from __future__ import annotations

import ast
import compileall
import importlib
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

PACKAGES = ("single_controller", "algos", "config", "planner", "workers", "trainer", "data", "verl_compat")


def run_at_import(tree: ast.AST):
    """The nodes that run when the module is imported: all but the bodies of functions."""
    for node in ast.iter_child_nodes(tree):
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from run_at_import(node)


def third_party_imports(root: Path) -> list[tuple[str, list[str]]]:
    """Every module-level ``import X`` / ``from X import a, b`` of the project's packages whose X is not the
    project's (those inside functions run later, if ever: a child needs them no more than a fresh process does)."""
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for node in run_at_import(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        found.setdefault(alias.name, set())
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.setdefault(node.module, set()).update(a.name for a in node.names)
    return [(m, sorted(names)) for m, names in found.items() if m.split(".")[0] not in PACKAGES]


def preload(imports: list[tuple[str, list[str]]]) -> None:
    """Import what the project imports from elsewhere; an optional dependency that is missing stays missing."""
    for module, names in imports:
        try:
            loaded = importlib.import_module(module)
            for name in names:
                getattr(loaded, name, None)  # resolves lazily loaded attributes (transformers' auto classes)
        except Exception:  # not installed, or not importable on this machine: the child will say
            pass


def start_child(module: str) -> tuple[int, int]:
    """Fork a child that imports ``module`` with none of the project loaded; its pid and the pipe of its error."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report an error through the pipe, exit at once (no atexit handlers of the parent)
        os.close(read)
        status = 0
        try:
            importlib.import_module(module)
        except BaseException:
            os.write(write, traceback.format_exc(limit=-4).encode()[-4000:])
            status = 1
        os._exit(status)
    os.close(write)
    return pid, read


def finish_child(pid: int, read: int) -> str | None:
    """None if the child imported its module, else its error."""
    with os.fdopen(read, "rb") as pipe:
        error = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    return None if status == 0 else error or f"exit status {status}"


def import_each_first(modules: list[str], at_once: int) -> dict[str, str]:
    """``{module: error}`` of the modules that fail to import first; ``at_once`` children run side by side."""
    failures, running, waiting = {}, {}, list(modules)
    while waiting or running:
        while waiting and len(running) < at_once:
            module = waiting.pop(0)
            running[module] = start_child(module)
        module = next(iter(running))
        error = finish_child(*running.pop(module))
        if error is not None:
            failures[module] = error
    return failures


def compile_once(root: Path) -> None:
    """Byte-compile the project into a private cache, so that the children do not compile every module anew."""
    sys.pycache_prefix = tempfile.mkdtemp(prefix="fresh_imports_")
    for package in PACKAGES:
        compileall.compile_dir(root / package, quiet=1)


def main(modules: list[str]) -> None:
    root = Path.cwd()
    sys.path.insert(0, str(root))
    compile_once(root)
    preload(third_party_imports(root))
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in PACKAGES)
    if loaded:
        raise SystemExit(f"the preload imported project modules {loaded}; the children would not start fresh")
    failures = import_each_first(modules, at_once=min(8, os.cpu_count() or 1))
    print(json.dumps(failures))


if __name__ == "__main__":
    main(sys.argv[1:])
