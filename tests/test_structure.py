"""The shape of the code: every module imports first in a fresh process, and no import points up a layer.

Layers, lowest first; a module imports only from its own layer and those below, and ``data`` and ``workers``
never import each other (the driver, ``trainer``, builds a run from both):
single_controller < algos < config < workers < data < trainer < main.py.
Inside a layer, its subpackages are layered the same way (``SUBLAYERS``): in ``workers`` a role builds on the
phases' math, which builds on tools and on the parallel machinery; in ``single_controller`` the worker groups
(``local``, ``ray``) build on the worker and its dispatch (``base``), which build on the data modules beside them.
The door to verl (``verl_compat``) sits beside them and imports the core; no core module imports it, and main.py
only its command-line translation (``verl_compat.cli``).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("single_controller", "algos", "config", "planner", "workers", "data", "trainer", "main")
DOOR = "verl_compat"
SUBLAYERS = {  # lowest first; a module directly in the package (not in a subpackage) ranks lowest
    "workers": ("parallel", "checkpoint", "tools", "compute", "runtime", "roles"),
    "single_controller": ("base", "local", "ray"),  # the worker groups: one process (local) or Ray's
}
MAIN_MAY_IMPORT = "verl_compat.cli"  # the entry point turns a verl command line into the core's config


def production_modules(packages: tuple[str, ...] = LAYERS[:-1]) -> dict[str, Path]:
    """``{dotted name: file}`` of every module of the layers (``main.py`` included), or of ``packages``."""
    modules = {"main": ROOT / "main.py"} if packages == LAYERS[:-1] else {}
    for package in packages:
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


def sublayer(name: str) -> tuple[str, int] | None:
    """``(package, rank)`` of a module in a layered package (a module beside the subpackages ranks -1)."""
    parts = name.split(".")
    order = SUBLAYERS.get(parts[0])
    if order is None or len(parts) < 2:
        return None
    return parts[0], order.index(parts[1]) if parts[1] in order else -1


def layering_violations(modules: dict[str, Path]) -> list[str]:
    """An import of a higher layer, or of the door from the core (one line per import statement and rule)."""
    bad = {}
    for name, path in modules.items():
        rank = LAYERS.index(name.split(".")[0])
        for line, target in imported_modules(name, path):
            top = target.split(".")[0]
            if (LAYERS[rank], top) == ("data", "workers"):
                bad.setdefault((name, line, "up"), f"{name}:{line} imports {target}: data never imports workers")
            elif top in LAYERS and LAYERS.index(top) > rank:
                bad.setdefault(
                    (name, line, "up"), f"{name}:{line} imports {target}: layer {top} is above {LAYERS[rank]}"
                )
            mine, theirs = sublayer(name), sublayer(target)
            if mine and theirs and mine[0] == theirs[0] and theirs[1] > mine[1]:
                bad.setdefault((name, line, "up"), f"{name}:{line} imports {target}: up inside {mine[0]}")
            allowed = name == "main" and (target == MAIN_MAY_IMPORT or target.startswith(MAIN_MAY_IMPORT + "."))
            if top == DOOR and not allowed:
                bad.setdefault((name, line, "door"), f"{name}:{line} imports {target}: the core never imports the door")
    return sorted(bad.values())


def test_no_module_imports_a_higher_layer_and_the_core_never_imports_the_door():
    modules = production_modules()
    assert len(modules) > 100 and "single_controller.ray.group" in modules  # the walk found the tree
    assert layering_violations(modules) == []


def test_the_layering_check_sees_upward_sideways_and_door_imports(tmp_path):
    """The check itself: a planted upward import, a data -> workers import, core imports of the door (main.py may
    import only its command-line translation)."""
    planted = {"config.planted": "def f():\n    from workers.compute import rollout\n"}
    planted["data.planted"] = "import workers.parallel.lora\n"
    planted["single_controller.ray.planted"] = "from verl_compat.single_controller.ray import base\n"
    planted["workers.planted"] = "def f():\n    import verl_compat\n"
    planted["workers.parallel.planted"] = "from workers.roles.role import Role\n"
    planted["single_controller.base.planted"] = "import single_controller.ray.group\n"
    planted["main"] = "from verl_compat.cli import translate\nfrom verl_compat.protocol import DataProto\n"
    for name, text in planted.items():
        (tmp_path / f"{name}.py").write_text(text)
    assert layering_violations({name: tmp_path / f"{name}.py" for name in planted}) == [
        "config.planted:2 imports workers.compute: layer workers is above config",
        "data.planted:1 imports workers.parallel.lora: data never imports workers",
        "main:2 imports verl_compat.protocol: the core never imports the door",
        "single_controller.base.planted:1 imports single_controller.ray.group: up inside single_controller",
        "single_controller.ray.planted:1 imports verl_compat.single_controller.ray: the core never imports the door",
        "workers.parallel.planted:1 imports workers.roles.role: up inside workers",
        "workers.planted:2 imports verl_compat: the core never imports the door",
    ]


def test_every_module_imports_first_in_a_fresh_process():
    """Each module of the layers and of the door, imported before any other of the project's modules
    (tests/fresh_imports.py).

    Catches import cycles that only bite in one order, e.g. a verl name imported first inside a Ray worker."""
    modules = [name for name in {**production_modules(), **production_modules((DOOR,))} if name != "main"]
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


def test_importing_the_core_and_the_trainer_imports_no_door_module():
    """The door adds, never patches: a fresh process that imports every core module (main.py aside) loads nothing
    of the door, and no ``verl``."""
    core = [name for name in production_modules() if name != "main"]
    code = (
        "import importlib, sys\n"
        f"for name in {core!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('verl_compat', 'verl')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
