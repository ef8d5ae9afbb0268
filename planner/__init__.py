"""The step planner: what a step of this config runs, in which order, on which workers.

Between the config (``config``: the schema and its loading) and the workers, which run what it plans:
``planner.dataflow`` (a phase's reads and writes), ``planner.phases`` (``STEP_PHASES``, the phases in order),
``planner.worker_roles`` (the models a worker holds), ``planner.trainer_modes`` (sync, colocated or separate
async), ``planner.plan`` (``make_plan``: the plan of one config, checking what spans components) and
``planner.load`` (a config loaded and planned).
"""

from planner.load import load_config, load_with_plan
from planner.plan import StepPlan, make_plan, num_workers, uses_critic

__all__ = ["StepPlan", "load_config", "load_with_plan", "make_plan", "num_workers", "uses_critic"]
