"""The phase table (planner.phases), the tables keyed by its phases' names, and their readers: a phase missing from
any of them fails here.

Readers: the routes (``declare_flows``), ``train_step``'s loop, the batching (``planner.batching.PHASE_BATCHES``: the
plan's checks, the dry run's batch table), the memory estimate (``PHASE_MEMORY``), the out-of-memory advice
(``OOM_ADVICE``) and the per-token timings (``PER_TOKEN``). Each test names the reader it holds to the table.
"""

import ast
from contextlib import contextmanager
from pathlib import Path

import pytest

from data.builtin import demo_model_config
from planner import load_config, make_plan
from planner.batching import PHASE_BATCHES
from planner.dataflow import DRIVER, WORKER
from planner.phases import PHASES, STEP_FLOW, STEP_PHASES
from planner.worker_roles import ROLE, ROLES
from trainer.observing.metrics import PER_TOKEN
from trainer.preflight.dry_run import phase_batches
from trainer.preflight.memory_estimate import model_sizes
from trainer.preflight.memory_phases import PHASE_MEMORY, estimate_memory
from trainer.running.faults import MEMORY_KEYS, OOM_ADVICE, _memory_hint
from trainer.running.step import StepState, TrainStep
from workers.roles.fsdp_workers import ActorRolloutRefWorker
from workers.roles.scoring_workers import CriticWorker, RewardModelWorker, TeacherWorker

# between them, these plans run every phase of the table
PLANS = {
    "grpo": [],
    "ppo_with_everything": [
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_in_reward=true",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.ppo_epochs=2",
        "reward.reward_model.enable=true",
        "reward.reward_model.model_path=/no/model/is/read",
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


WORKER_PHASES = {phase.name for phase in STEP_PHASES if phase.on == WORKER}


def test_every_worker_phase_names_a_role_and_a_method_and_has_its_batching_and_memory_estimate():
    """What train_step's calls look up by a phase's entry, and the tables of the batching and the memory estimate:
    each names exactly the worker phases."""
    assert set(WORKER_CLASSES) == set(ROLE)  # a new role needs its worker class here (and in trainer.running.placement)
    for phase in STEP_PHASES:
        if phase.on == DRIVER:
            assert phase.role is phase.method is None, phase.name
            continue
        assert phase.role in ROLE, phase.name
        assert callable(getattr(WORKER_CLASSES[phase.role], phase.method, None)), (phase.name, phase.method)
    assert set(PHASE_BATCHES) == WORKER_PHASES
    assert set(PHASE_MEMORY) == WORKER_PHASES
    for role in ROLES:
        assert role.shares is None or role.shares in ROLE


def _at(cfg, key):
    """What a message naming dotted ``key`` means: the value there (through a mapping's entries)."""
    for part in key.split("."):
        cfg = cfg[part] if isinstance(cfg, dict) else getattr(cfg, part)
    return cfg


def test_a_batchings_section_is_the_one_its_key_names():
    """An entry of PHASE_BATCHES names its section's key (for messages) and reads the section: the same one."""
    cfg = load_config(PLANS["ppo_with_everything"])
    for name, batching in PHASE_BATCHES.items():
        if batching.section is None:  # every row at once: the plan's count
            assert batching.rows and batching.rows_key(cfg), name
            continue
        section = _at(cfg, batching.section)
        assert batching.config(cfg) is section, name
        assert all(hasattr(section, f) for f in (batching.micro, batching.dynamic, batching.budget) if f), name


def test_a_roles_keys_name_what_it_reads():
    """A role names the keys of its model section and path (for messages) and reads them: the same ones."""
    cfg = load_config(
        [
            "algorithm.adv_estimator=gae",
            "critic.model.path=/no/critic",
            "reward.reward_model.enable=true",
            "reward.reward_model.model_path=/no/reward/model",
            "distillation.enabled=true",
            "distillation.teacher_models.teacher_model.model_path=/no/teacher",
        ]
    )
    for role in ROLES:
        assert role.model_config(cfg) is _at(cfg, role.model), role.name
        for name, (key, path) in role.paths(cfg).items():
            assert key.startswith(role.path) and path == _at(cfg, key), name
    assert {"/no/critic", "/no/reward/model", "/no/teacher"} <= {p for r in ROLES for _, p in r.paths(cfg).values()}


def test_every_worker_method_has_out_of_memory_advice():
    """OOM_ADVICE names exactly the worker phases whose batch has no micro-batch keys to lower (every row at once);
    the others' advice is their batch keys."""
    assert set(OOM_ADVICE) == {name for name, batching in PHASE_BATCHES.items() if batching.section is None}
    for phase in STEP_PHASES:
        if phase.method:
            advice = OOM_ADVICE.get(phase.name) or PHASE_BATCHES[phase.name].keys()
            assert MEMORY_KEYS[phase.method] == advice and advice, phase.name
            assert advice in _memory_hint(f"{phase.role}.{phase.method}")


def test_per_token_timings_are_of_phases_timed_on_their_own_line():
    """PER_TOKEN names phases (each worker phase with a timing line of its own among them) timed on their own line."""
    assert {name for name in WORKER_PHASES if PHASES[name].timer == name} <= set(PER_TOKEN)
    for name, counted in PER_TOKEN.items():
        assert PHASES[name].timer == name and counted in ("response", "all"), name


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
        assert phase.key == PHASE_BATCHES[phase.name].key(cfg) and phase.terms["weights"] > 0


def test_the_dry_run_has_each_worker_phase_that_runs(planned):
    cfg, plan = planned
    batches = phase_batches(cfg, plan)
    assert [b.name for b in batches] == [p.name for p in STEP_PHASES if p.name in PHASE_BATCHES and plan.runs(p.name)]
    assert all(b.micro_batches >= 1 and b.tokens > 0 for b in batches)


class _Recorder(TrainStep):
    """The real step loop (``run_phases``) with each phase's code replaced by a note of its name and timer."""

    def __init__(self, plan):
        self.plan, self.order, self.timer = plan, [], None

    def _call(self, phase, batch, *args, **kwargs):
        self.order.append((phase, self.timer))
        return {}

    @contextmanager
    def _phase(self, name, timing):
        outer, self.timer = self.timer, name
        yield
        self.timer, timing[name] = outer, 0.0


def _noting(name):
    def code(self, state):
        if name == "filter_groups":  # the filter runs the table's prefix on each generation batch
            self.run_phases(self.plan.step_phases[: self.plan.step_phases.index(name)], state)
        self.order.append((name, self.timer))

    return code


_Recorder.STEP_CODE = {name: _noting(name) for name in TrainStep.STEP_CODE}


def test_train_step_runs_the_plans_phases_in_the_tables_order_each_on_its_timer(planned):
    """The driver runs the table: each phase the plan runs once, in the table's order, worker phases without driver
    code called by name, each under the timing line its entry names."""
    _, plan = planned
    recorder = _Recorder(plan)
    state = StepState(batch=None)
    recorder.run_phases(plan.step_phases, state)
    assert [name for name, _ in recorder.order] == list(plan.step_phases)
    for name, timer in recorder.order:
        assert PHASES[name].timer in (timer, None), name
    assert set(state.timing) == {PHASES[name].timer for name in plan.step_phases} - {None}
    assert set(TrainStep.STEP_CODE) <= set(PHASES)
    for name in set(PHASES) - set(TrainStep.STEP_CODE):  # a phase without driver code is a worker call
        assert PHASES[name].on == WORKER, name


def test_a_phase_that_selects_rows_on_the_driver_brings_what_crosses_it_there_and_back():
    """An entry with ``selects_rows`` (a driver phase that drops or reorders rows: balancing the workers' tokens,
    filtering prompt groups) makes what the rollout wrote and a later worker phase reads travel through it."""
    plan = make_plan(load_config([]), 2)
    step = make_plan(load_config(["trainer.balance_batch=true"]), 2).flows[STEP_FLOW]
    assert PHASES["balance"].selects_rows and "balance" not in [p.name for p in plan.flows[STEP_FLOW].phases]
    kept = set(plan.flows[STEP_FLOW].route("gen").keep)
    assert kept and step.route("gen").keep == () and kept <= set(step.route("gen").give)
    assert kept <= set(step.phase("balance").writes) and kept <= set(step.route("update_actor").send)


# the only production files that name a phase or a role by its string: the two tables and the driver's code of the
# phases (``trainer.running.step.STEP_CODE``), and the keys of the tables keyed by a phase's name; elsewhere a word
# equal to a role's name means something else, said here
TABLES = {"planner/phases.py", "planner/worker_roles.py", "trainer/running/step.py"}
PHASE_TABLES = {"PHASE_BATCHES", "PHASE_MEMORY", "OOM_ADVICE", "PER_TOKEN"}
OTHER_MEANINGS = {
    ("algos/distillation.py", "teacher"): "a metric's name (distillation/teacher_mass)",
    ("config/distillation.py", "teacher"): "the teacher role's instance names (worker_roles imports this module)",
    ("verl_compat/cli/inert.py", "critic"): "the config section",
    ("planner/plan.py", "critic"): "the config section",
    ("planner/batching.py", "critic"): "the config section",
    ("verl_compat/cli/normalize.py", "critic"): "the config section",
    ("trainer/running/build.py", "critic"): "the config section",
    ("workers/compute/actor.py", "actor"): "the metrics' namespace (verl's actor/...)",
    ("workers/compute/critic.py", "critic"): "the metrics' namespace (verl's critic/...)",
    ("workers/roles/fsdp_workers.py", "actor"): "the metrics' namespace (verl's actor/...)",
    ("workers/roles/scoring_workers.py", "critic"): "the metrics' namespace (verl's critic/...)",
    ("workers/roles/fsdp_workers.py", "actor_rollout"): "verl's role argument of ActorRolloutRefWorker",
    ("workers/roles/fsdp_workers.py", "ref"): "verl's role argument of ActorRolloutRefWorker",
}
PHASE_CALLS = ("runs", "_call", "route", "_phase", "phase", "_worker")


def names_by_string(source: str) -> list[tuple[int, str]]:
    """(line, name) of each role named by a string (docstrings aside) and each phase named by a string to a call
    that looks a phase up (``plan.runs("gen")``, ``_call("gen", ...)``, ``PHASES["gen"]``)."""
    tree, roles = ast.parse(source), {r.name for r in ROLES} | {r.worker for r in ROLES}
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    table_keys = {
        id(key)
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Dict)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name) and target.id in PHASE_TABLES
        for key in node.value.keys
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in roles and id(node) not in docstrings | table_keys:
            found.append((node.lineno, node.value))
        first = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PHASE_CALLS:
            first = node.args[0] if node.args else None
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "PHASES":
            first = node.slice
        if isinstance(first, ast.Constant) and first.value in PHASES:
            found.append((node.lineno, first.value))
    return found


def test_no_other_production_file_names_a_phase_or_a_role_by_string():
    root = Path(__file__).resolve().parents[2]
    files = sorted(
        p
        for d in ("algos", "config", "planner", "single_controller", "trainer", "workers", "data")
        for p in (root / d).rglob("*.py")
    )
    found = []
    for path in files:
        name = path.relative_to(root).as_posix()
        named = names_by_string(path.read_text()) if name not in TABLES else []
        found += [f"{name}:{line} {word!r}" for line, word in named if (name, word) not in OTHER_MEANINGS]
    assert not found, "name it through planner.phases / planner.worker_roles (e.g. ACTOR.name): " + ", ".join(found)
    example = 'plan.runs("gen")\nx = PHASES["adv"]\ny = "critic"\nPER_TOKEN = {"ref": "ref"}'
    assert names_by_string(example) == [(1, "gen"), (2, "adv"), (3, "critic"), (4, "ref")]  # a table's key aside
