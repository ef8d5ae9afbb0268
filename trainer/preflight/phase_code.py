"""Where each phase of a step runs: the ``file:function`` a dry run prints beside the phase's name.

A phase with driver code runs the method ``trainer.running.step.TrainStep.STEP_CODE`` names; any other is its entry's
worker method (``planner.phases.STEP_PHASES``) on its role's worker class in ``workers/roles/``. Both are read from
the source with ``ast``, so a dry run imports neither Ray nor the trainer.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from planner.phases import PHASES
from planner.plan import StepPlan

ROOT = Path(__file__).resolve().parents[2]
STEP_FILE, ROLES = "trainer/running/step.py", "workers/roles"


@cache
def driver_code() -> dict[str, str]:
    """phase name -> ``trainer/running/step.py:TrainStep._gen``, from the literal ``STEP_CODE`` table."""
    for node in ast.walk(ast.parse((ROOT / STEP_FILE).read_text())):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                target = item.target if isinstance(item, ast.AnnAssign) else None
                if isinstance(target, ast.Name) and target.id == "STEP_CODE" and isinstance(item.value, ast.Dict):
                    return {
                        key.value: f"{STEP_FILE}:{node.name}.{value.id}"
                        for key, value in zip(item.value.keys, item.value.values, strict=True)
                        if isinstance(key, ast.Constant) and isinstance(value, ast.Name)
                    }
    return {}


@cache
def worker_methods() -> dict[str, list[str]]:
    """method name -> each ``workers/roles/<file>:<Class>.<method>`` that defines it."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / ROLES).glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        found.setdefault(item.name, []).append(f"{ROLES}/{path.name}:{node.name}.{item.name}")
    return found


def phase_code(name: str) -> str:
    """The ``file:function`` that runs phase ``name``: its driver code, then (``->``) the worker method it calls."""
    phase = PHASES[name]
    places = worker_methods().get(phase.method or "", [])
    by_role = [p for p in places if (phase.role or "") in p.partition(":")[2].lower()]
    method = (by_role or places or [f"{phase.role} worker: {phase.method}"])[0] if phase.method else None
    return " -> ".join(filter(None, [driver_code().get(name), method]))


def phase_lines(plan: StepPlan) -> list[str]:
    """One line per phase a step of ``plan`` runs, in order: its name, the role that runs it, its code."""
    lines = ["phases of a step, in order (phase, role, code):"]
    for i, name in enumerate(plan.step_phases, 1):
        role = PHASES[name].role or "driver"
        lines.append(f"  {i:2d}. {name:24s} {role:8s} {phase_code(name)}")
    return lines
