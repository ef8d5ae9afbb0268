"""The phase table (config.phases) and its readers: a phase missing from any of them fails here.

Readers: the routes (``declare_flows``), ``train_step``'s timed lines, the memory estimate, the dry run's batch table
and the out-of-memory advice. Each test names the reader it holds to the table.
"""

import ast
import inspect
import textwrap

import pytest

from config import load_config, make_plan
from config.dataflow import DRIVER, WORKER
from config.phases import PHASES, STEP_FLOW, STEP_PHASES
from config.worker_roles import ROLE, ROLES
from data.builtin import demo_model_config
from trainer.faults import MEMORY_KEYS, _memory_hint
from trainer.ppo_trainer import RayPPOTrainer
from trainer.preflight.dry_run import phase_batches
from trainer.preflight.memory_estimate import model_sizes
from trainer.preflight.memory_phases import ESTIMATORS, estimate_memory
from workers.roles.fsdp_workers import ActorRolloutRefWorker, CriticWorker, RewardModelWorker, TeacherWorker

# between them, these plans run every phase of the table
PLANS = {
    "grpo": [],
    "ppo_with_everything": [
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_in_reward=true",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.ppo_epochs=2",
        "reward_model.enable=true",
        "reward_model.model.path=/no/model/is/read",
        "trainer.balance_batch=true",
    ],
    "remax": ["algorithm.adv_estimator=remax"],
    "dapo": ["algorithm.filter_groups.enable=true", "data.gen_batch_size=24", "trainer.rollout_data_dir=/no/dumps"],
    "opd": ["distillation.enabled=true", "distillation.teacher_models.teacher_model.model_path=/no/teacher/is/read"],
    "async": ["trainer.v1.trainer_mode=colocate_async"],
}
WORKER_CLASSES = {
    "actor": ActorRolloutRefWorker,
    "ref": ActorRolloutRefWorker,
    "critic": CriticWorker,
    "rm": RewardModelWorker,
    "teacher": TeacherWorker,
}


@pytest.fixture(scope="module", params=list(PLANS))
def planned(request):
    cfg = load_config(PLANS[request.param])
    return cfg, make_plan(cfg, 2)


def test_every_worker_phase_names_a_role_a_method_an_estimate_and_its_batch_keys():
    """What the memory estimate, the out-of-memory advice and train_step's calls look up by a phase's entry."""
    assert set(WORKER_CLASSES) == set(ROLE)  # a new role needs its worker class here (and in trainer.placement)
    for phase in STEP_PHASES:
        if phase.on == DRIVER:
            assert phase.role is phase.method is phase.memory is phase.batch is None, phase.name
            continue
        assert phase.role in ROLE and phase.memory in ESTIMATORS and phase.batch is not None, phase.name
        assert callable(getattr(WORKER_CLASSES[phase.role], phase.method, None)), (phase.name, phase.method)
        assert MEMORY_KEYS[phase.method] == phase.oom_advice and phase.oom_advice, phase.name
        assert phase.oom_advice in _memory_hint(f"{phase.role}.{phase.method}")
    for role in ROLES:
        assert role.shares is None or role.shares in ROLE


def test_the_plans_run_every_phase():
    ran = {p.name for overrides in PLANS.values() for p in make_plan(load_config(overrides), 2).flows[STEP_FLOW].phases}
    assert ran == set(PHASES)


def test_the_routes_hold_each_phase_that_runs_in_the_tables_order(planned):
    cfg, plan = planned
    declared = [p.name for p in plan.flows[STEP_FLOW].phases]
    assert declared == [p.name for p in STEP_PHASES if plan.runs(p.name)]
    with pytest.raises(KeyError, match="no phase 'generate'"):
        plan.runs("generate")


def test_the_memory_estimate_has_each_worker_phase_that_runs(planned):
    cfg, plan = planned
    demo = demo_model_config(cfg.builtin)
    models = {
        "actor": model_sizes(demo, cfg.actor_rollout_ref.model),
        "critic": model_sizes(demo, None, value_head=True),
        "rm": model_sizes(demo, None, value_head=True),
        "teacher": model_sizes(demo, None),
    }
    estimate = estimate_memory(cfg, plan, models, "cpu", val_rows=4)
    worker = [p.name for p in STEP_PHASES if p.on == WORKER and plan.runs(p.name)]
    assert [p.name for p in estimate.phases] == ["load", *worker, "validate"]
    for phase in estimate.phases[1:-1]:
        assert phase.key == PHASES[phase.name].batch.key(cfg) and phase.terms["weights"] > 0


def test_the_dry_run_has_each_worker_phase_that_runs(planned):
    cfg, plan = planned
    batches = phase_batches(cfg, plan)
    assert [b.name for b in batches] == [p.name for p in STEP_PHASES if p.batch and plan.runs(p.name)]
    assert all(b.micro_batches >= 1 and b.tokens > 0 for b in batches)


def _phase_calls(cls: type, method: str, path: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(callee, phase) of each ``self._phase/_worker/_call("<phase>", ...)`` in ``cls.<method>``, in source order,
    with the other methods of ``cls`` it refers to expanded where it refers to them; ``self.plan.runs`` of a name
    that is not a phase fails here."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(cls, method))))
    events = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            first = node.args[0] if node.args else None
            literal = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
            if node.func.attr == "runs" and literal is not None:
                assert literal in PHASES, f"{method}: plan.runs({literal!r}) names no phase"
            if node.func.attr in ("_phase", "_worker", "_call") and literal is not None:
                events.append((node.lineno, node.col_offset, [(node.func.attr, literal)]))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            name = node.attr
            expand = name not in ("_phase", "_worker", "_call", *path, method) and inspect.isfunction(
                getattr(cls, name, None)
            )
            if expand:
                events.append((node.lineno, node.col_offset, _phase_calls(cls, name, (*path, method))))
    return [call for *_, calls in sorted(events, key=lambda e: e[:2]) for call in calls]


def test_train_step_times_each_phase_in_the_tables_order_and_calls_each_worker_phase():
    """train_step is written out (one timed line per phase, read as the algorithm); it must say what the table
    says: each timed phase once, in order, and each worker phase called by its name."""
    calls = _phase_calls(RayPPOTrainer, "train_step")
    timed = [phase for callee, phase in calls if callee in ("_phase", "_worker")]
    assert timed == [p.name for p in STEP_PHASES if p.timed]
    called = {phase for callee, phase in calls if callee in ("_worker", "_call")}
    assert called == {p.name for p in STEP_PHASES if p.on == WORKER}


def test_a_phase_that_selects_rows_on_the_driver_brings_what_crosses_it_there_and_back():
    """An entry with ``selects_rows`` (a driver phase that drops or reorders rows: balancing the workers' tokens,
    filtering prompt groups) makes what the rollout wrote and a later worker phase reads travel through it."""
    plan = make_plan(load_config([]), 2)
    step = make_plan(load_config(["trainer.balance_batch=true"]), 2).flows[STEP_FLOW]
    assert PHASES["balance"].selects_rows and "balance" not in [p.name for p in plan.flows[STEP_FLOW].phases]
    kept = set(plan.flows[STEP_FLOW].route("gen").keep)
    assert kept and step.route("gen").keep == () and kept <= set(step.route("gen").give)
    assert kept <= set(step.phase("balance").writes) and kept <= set(step.route("update_actor").send)
