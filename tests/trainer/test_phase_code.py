"""The dry run's list of a step's phases: in the plan's order, each naming code that exists and runs it."""

import importlib

from planner import load_with_plan
from planner.phases import STEP_PHASES
from trainer.preflight.phase_code import phase_code, phase_lines


def _resolve(place: str):
    """``file.py:Class.function`` -> the function object."""
    path, _, dotted = place.partition(":")
    target = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    for part in dotted.split("."):
        target = getattr(target, part)
    return target


def test_every_phase_names_the_code_that_runs_it():
    for phase in STEP_PHASES:
        places = phase_code(phase.name).split(" -> ")
        assert places and all(callable(_resolve(place)) for place in places), phase.name
        if phase.method:  # a worker phase names its worker method (after the driver code that calls it, if any)
            assert places[-1].endswith(f".{phase.method}"), (phase.name, places)


def test_the_dry_run_lists_the_plans_phases_in_order():
    _, plan = load_with_plan(["algorithm.adv_estimator=gae"])
    lines = phase_lines(plan)[1:]
    assert [line.split()[1] for line in lines] == list(plan.step_phases)
    assert "CriticWorker.update_critic" in lines[plan.step_phases.index("update_critic")]
