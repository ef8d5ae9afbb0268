"""The shape of the code: every module imports first in a fresh process, and no import points up a layer.

Layers, lowest first; a module imports only from its own layer and those below, and ``data`` and ``workers``
never import each other (the driver, ``trainer``, builds a run from both):
single_controller < algos < config < workers < data < trainer < main.py.
Inside single_controller, the core never imports compat/ (verl's extra API); the modules that are verl's import
paths join the two (single_controller/__init__.py says how).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("single_controller", "algos", "config", "workers", "data", "trainer", "main")
# verl's and the seeds' import paths: they only re-export, and may import both the core and compat/
VERL_PATHS = {
    "single_controller",
    "single_controller.protocol",
    "single_controller.base.decorator",
    "single_controller.base.megatron",
    "single_controller.base.megatron.worker",
    "single_controller.ray",
    "single_controller.ray.base",
    "single_controller.ray.megatron",
    "single_controller.models",
    "single_controller.models.llama_tp_mlp",
}


def production_modules() -> dict[str, Path]:
    """``{dotted name: file}`` of every module of the layers (``main.py`` included)."""
    modules = {"main": ROOT / "main.py"}
    for package in LAYERS[:-1]:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_modules(name: str, path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in the file, at any depth (in functions too), relative ones resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], *filter(None, [base])]
                )
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]  # `from pkg import module`
    return found


def layering_violations(modules: dict[str, Path]) -> list[str]:
    """An import of a higher layer, or of single_controller.compat from a core single_controller module (one line
    per import statement and rule)."""
    bad = {}
    for name, path in modules.items():
        rank = LAYERS.index(name.split(".")[0])
        core = name.startswith("single_controller") and not name.startswith("single_controller.compat")
        for line, target in imported_modules(name, path):
            top = target.split(".")[0]
            if (LAYERS[rank], top) == ("data", "workers"):
                bad.setdefault((name, line, "up"), f"{name}:{line} imports {target}: data never imports workers")
            elif top in LAYERS and LAYERS.index(top) > rank:
                bad.setdefault(
                    (name, line, "up"), f"{name}:{line} imports {target}: layer {top} is above {LAYERS[rank]}"
                )
            if core and name not in VERL_PATHS and target.startswith("single_controller.compat"):
                bad.setdefault(
                    (name, line, "compat"), f"{name}:{line} imports {target}: the core never imports compat/"
                )
    return sorted(bad.values())


def test_no_module_imports_a_higher_layer_and_the_core_never_imports_compat():
    modules = production_modules()
    assert len(modules) > 100 and "single_controller.ray.group" in modules  # the walk found the tree
    assert layering_violations(modules) == []


def test_the_layering_check_sees_upward_sideways_and_compat_imports(tmp_path):
    """The check itself: a planted upward import, a data -> workers import and a core import of compat/."""
    planted = {"config.planted": "def f():\n    from workers.compute import rollout\n"}
    planted["data.planted"] = "import workers.parallel.lora\n"
    planted["single_controller.ray.planted"] = "from single_controller.compat import fused\n"
    for name, text in planted.items():
        (tmp_path / f"{name}.py").write_text(text)
    assert layering_violations({name: tmp_path / f"{name}.py" for name in planted}) == [
        "config.planted:2 imports workers.compute: layer workers is above config",
        "data.planted:1 imports workers.parallel.lora: data never imports workers",
        "single_controller.ray.planted:1 imports single_controller.compat: the core never imports compat/",
    ]


def test_verl_paths_only_re_export():
    """verl's import paths define nothing (a class or function there would be core code that can see compat/)."""
    modules = production_modules()
    for name in VERL_PATHS:
        tree = ast.parse(modules[name].read_text())
        defined = [
            n.name
            for n in tree.body
            if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.name != "__getattr__"
        ]
        assert defined == [], f"{name} defines {defined}; move them to a core or a compat module"


def test_every_module_imports_first_in_a_fresh_process():
    """Each module of the layers, imported before any other of the project's modules (tests/fresh_imports.py).

    Catches import cycles that only bite in one order, e.g. a verl name imported first inside a Ray worker."""
    modules = [name for name in production_modules() if name != "main"]
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "fresh_imports.py"), *modules],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,  # mostly one import of torch, Ray and transformers; the margin is for a loaded machine
    )
    assert out.returncode == 0, out.stderr[-3000:]
    failures = json.loads(out.stdout.strip().splitlines()[-1])
    assert failures == {}, "\n\n".join(f"{m}:\n{e}" for m, e in failures.items())


def test_importing_the_core_and_the_trainer_imports_no_compat_module():
    """The verl layer adds, never patches: a fresh process that imports every core module of single_controller
    and the trainer's driver and workers loads nothing of compat/ (verl's paths load it on first use)."""
    core = [
        name
        for name in production_modules()
        if name.startswith("single_controller")
        and not name.startswith("single_controller.compat")
        and name not in VERL_PATHS
        and not name.startswith("single_controller.base.megatron")
    ]
    code = (
        "import importlib, sys\n"
        f"for name in {[*core, 'trainer.ppo_trainer', 'workers.roles.fsdp_workers']!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.startswith('single_controller.compat')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
