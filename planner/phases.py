"""The phases of a training step, declared once.

``STEP_PHASES`` lists a step's phases in the order it runs them. An entry says where the phase runs (the driver or
the workers), which worker role computes it with which method, the per-token keys it reads and writes, whether it
runs for a plan and the timing line it is timed on. The roles, the models a worker may hold, are the other table
(``planner.worker_roles.ROLES``). What else a phase has lives in a table keyed by its name, in the code that reads it:

- ``declare_flows`` (below): the routes of each flow's phases that run (``planner.dataflow``), kept in the plan;
- ``trainer.running.step.TrainStep.run``: runs the plan's phases in this order, each a worker call of the
  method named here or the driver code ``STEP_CODE`` holds under its name, timed on the line its entry names;
- ``planner.batching.PHASE_BATCHES``: what sizes a worker phase's batch (the plan's checks, the dry run's batch
  arithmetic, the memory estimate's micro-batches);
- ``trainer.preflight.memory_phases.PHASE_MEMORY``: each worker phase's memory estimate, over the roles;
- ``trainer.running.faults.OOM_ADVICE``: what to lower when a worker phase runs out of memory (default: its batch
  keys);
- ``trainer.observing.metrics.PER_TOKEN``: the tokens ``timing_per_token_ms/<phase>`` divides its time by.

Adding a phase is an entry here plus its compute code (a worker method, or the driver's in ``trainer.running.step``)
and, for a worker phase, its batching and memory estimate (``tests/trainer/test_phases.py`` names what is missing); a
new role is also an entry of ``planner.worker_roles.ROLES``. A phase that drops or reorders rows on the driver
(``selects_rows``) makes every key written before it and read after it pass through the driver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from algos.registry import estimator_needs, policy_loss_spec
from config.distillation import teacher_columns, teacher_outputs
from planner.dataflow import DRIVER, WORKER, Dataflow, Phase, when

PROMPT = ("input_ids", "attention_mask", "position_ids")  # the dataloader's left-padded prompts (B, P)
SEQUENCE = PROMPT  # the same names for prompt + response (B, P + R), as the rollout writes them
AGENT_KEYS = ("raw_prompt", "agent_name", "tools_kwargs")  # non-tensors the multi-turn rollout reads, when present
WORKER_ESTIMATOR_INPUTS = ("values", "old_log_probs", "sum_pi_squared")  # what workers compute for an estimator
# what the reward function reads (with tool turns, a response's length is its attended tokens), and validation's
SCORED = ("responses", "response_mask", "attention_mask")
STEP_FLOW, VALIDATION_FLOW, GREEDY_FLOW = "step", "validation", "greedy_baseline"


def forward_keys(remove_padding: bool) -> tuple[str, ...]:
    """What a forward over the responses reads (``responses``: their width R); packed rows (remove-padding) take
    their positions from the attention mask."""
    return ("input_ids", "attention_mask", *when(not remove_padding, "position_ids"), "responses")


def uses_full_kl(actor: Any) -> bool:
    """``kl_loss_type=full`` reads reference logits in the update: the ref model lives in the actor's process."""
    return bool(actor.use_kl_loss) and actor.kl_loss_type == "full"


def uses_ref_log_prob(actor: Any) -> bool:
    """The sampled-token KL losses (k1, k2, k3, abs) read the reference log-probs the ref worker computed."""
    return bool(actor.use_kl_loss) and not uses_full_kl(actor)


def rollout_log_probs(cfg: Any) -> bool:
    """The rollout returns rollout_log_probs: ``rollout.calculate_log_probs`` (multi-turn too: 0 on tool tokens,
    which no loss reads)."""
    return bool(cfg.actor_rollout_ref.rollout.calculate_log_probs)


def samples_tokens(cfg: Any) -> bool:
    """Whether the driver writes sampled responses token by token: the run report's, or the rollout dumps."""
    return bool(cfg.trainer.report.enable and cfg.trainer.report.samples_per_step) or bool(cfg.trainer.rollout_data_dir)


@dataclass(frozen=True)
class Step:
    """What a declaration reads: the config, the plan's decisions, and the key groups they imply."""

    cfg: Any
    plan: Any  # a planner.plan.StepPlan (planner.plan imports this module, not the other way)

    @property
    def policy(self) -> tuple[str, ...]:
        """What the actor's and the reference's forwards read."""
        return forward_keys(self.cfg.actor_rollout_ref.model.use_remove_padding)

    @property
    def value(self) -> tuple[str, ...]:
        """What the critic's forwards read."""
        return forward_keys(self.cfg.critic.model.use_remove_padding)

    @property
    def has_old(self) -> bool:
        """Old log-probs exist before the update: the forward's, or the rollout's own."""
        return self.plan.recompute_old_log_prob or self.plan.old_log_prob_from_rollout

    @property
    def reward_model(self) -> bool:
        return bool(self.cfg.reward.reward_model.enable)


Keys = tuple[str, ...] | Callable[[Step], tuple[str, ...]]


@dataclass(frozen=True)
class StepPhase:
    """One phase of a step (see the module docstring). ``reads``/``writes``: per-token keys, or a function of the
    ``Step``; ``runs``: whether a plan runs it; ``role`` and ``method``: the worker role and its method that compute
    a worker phase; ``timer``: the line of ``timing_s/`` that times it (its own name by default, another phase's to
    count within it, ``None``: untimed); ``columns``: the non-tensor columns it reads (or a function of the
    ``Step``)."""

    name: str
    on: str
    reads: Keys = ()
    writes: Keys = ()
    runs: Callable[[Step], bool] = lambda s: True
    role: str | None = None
    method: str | None = None
    columns: Keys = ()
    timer: str | None = ""
    selects_rows: bool = False

    def __post_init__(self) -> None:
        if self.timer == "":  # by default a phase is timed on its own line
            object.__setattr__(self, "timer", self.name)

    def declared(self, s: Step) -> Phase:
        """This phase's per-token reads and writes for ``s``."""
        reads, writes, columns = (
            keys(s) if callable(keys) else keys for keys in (self.reads, self.writes, self.columns)
        )
        return Phase(self.name, self.on, reads, writes, columns)


def _gen_writes(s: Step) -> tuple[str, ...]:
    sampled = (
        *when(rollout_log_probs(s.cfg), "rollout_log_probs"),
        *when(s.plan.old_log_prob_from_rollout, "old_log_probs"),
    )
    return (*SEQUENCE, "responses", "response_mask", *sampled)


def _adv_reads(s: Step) -> tuple[str, ...]:
    """The estimator's inputs; the in-reward KL penalty and actor/ref_kl read both log-probs when both exist."""
    estimator = s.cfg.algorithm.adv_estimator
    return (
        "token_level_scores",
        "response_mask",
        *when(s.plan.use_critic, "values"),
        *(k for k in WORKER_ESTIMATOR_INPUTS if estimator_needs(estimator, k)),
        *when(s.plan.compute_greedy_baseline, "reward_baselines"),
        *when(s.has_old and s.plan.compute_ref_log_prob, "old_log_probs", "ref_log_prob"),
    )


def _update_actor_reads(s: Step) -> tuple[str, ...]:
    """Without old_log_probs the update is on-policy (``planner.plan.is_single_step``); the policy loss may need
    more."""
    actor = s.cfg.actor_rollout_ref.actor
    return (
        *s.policy,
        "response_mask",
        "advantages",
        *when(s.has_old, "old_log_probs"),
        *when(uses_ref_log_prob(actor), "ref_log_prob"),
        *policy_loss_spec(actor.policy_loss.loss_mode).needs,
        *teacher_outputs(s.cfg.distillation),  # the distillation loss's
    )


STEP_PHASES: tuple[StepPhase, ...] = (
    StepPhase("prompts", DRIVER, writes=PROMPT, timer=None),  # the dataloader's batch
    # ReMax's baseline: each prompt's greedy response, generated (GREEDY_FLOW) and scored
    StepPhase("gen_max", DRIVER, PROMPT, ("reward_baselines",), runs=lambda s: s.plan.compute_greedy_baseline),
    StepPhase(
        "gen",
        WORKER,
        PROMPT,
        _gen_writes,
        role="actor",
        method="generate_sequences",
        columns=AGENT_KEYS,
    ),
    # trainer.v1's async modes: a batch is generated while another trains (on a group of its own, or before the
    # update on the same one), so what the rollout writes comes to the driver with it (trainer.asynchronous.ahead)
    StepPhase("handover", DRIVER, _gen_writes, _gen_writes, runs=lambda s: s.plan.mode.asynchronous, timer=None),
    # trainer.balance_batch, after generation and before the reward: the driver reorders the rows so
    # each worker's share holds a similar number of tokens (trainer.running.balance); with dynamic sampling,
    # filter_groups balances the rows it keeps instead (the DAPO loop)
    StepPhase(
        "balance", DRIVER, runs=lambda s: s.plan.balance_batch and not s.plan.dynamic_sampling, selects_rows=True
    ),
    StepPhase(  # timed within the reward's line
        "rm_score",
        WORKER,
        (*SEQUENCE, "response_mask"),
        ("rm_scores",),
        runs=lambda s: s.reward_model,
        role="rm",
        method="compute_rm_score",
        timer="reward",
    ),
    StepPhase("reward", DRIVER, lambda s: (*SCORED, *when(s.reward_model, "rm_scores")), ("token_level_scores",)),
    # DAPO's dynamic sampling: the phases above run once per generation batch, then the prompt groups with signal
    # are kept (trainer.running.dynamic_sampling.collect), and with trainer.balance_batch balanced over the workers; the
    # kept rows come from several batches, so what crosses it comes to the driver and goes back
    StepPhase("filter_groups", DRIVER, runs=lambda s: s.plan.dynamic_sampling, timer=None, selects_rows=True),
    StepPhase(
        "old_log_prob",
        WORKER,
        lambda s: s.policy,
        lambda s: ("old_log_probs", *when(s.plan.compute_sum_pi_squared, "sum_pi_squared")),
        runs=lambda s: s.plan.recompute_old_log_prob,
        role="actor",
        method="compute_log_prob",
    ),
    StepPhase(
        "ref",
        WORKER,
        lambda s: s.policy,
        ("ref_log_prob",),
        runs=lambda s: s.plan.compute_ref_log_prob,
        role="ref",
        method="compute_ref_log_prob",
    ),
    StepPhase(  # on-policy distillation: the teachers score the rows that train (after the filter)
        "teacher",
        WORKER,
        lambda s: s.policy,
        lambda s: teacher_outputs(s.cfg.distillation),
        runs=lambda s: s.plan.compute_teacher,
        role="teacher",
        method="compute_teacher_log_prob",
        columns=lambda s: teacher_columns(s.cfg.distillation),  # several teachers: the column that routes rows
    ),
    StepPhase(
        "values",
        WORKER,
        lambda s: (*s.value, "response_mask"),
        ("values",),
        runs=lambda s: s.plan.use_critic,
        role="critic",
        method="compute_values",
    ),
    StepPhase("adv", DRIVER, _adv_reads, ("token_level_rewards", "advantages", "returns")),
    StepPhase(
        "update_critic",
        WORKER,
        lambda s: (*s.value, "response_mask", "values", "returns"),
        runs=lambda s: s.plan.use_critic,
        role="critic",
        method="update_critic",
    ),
    StepPhase(
        "update_actor",
        WORKER,
        _update_actor_reads,
        role="actor",
        method="update_actor",
    ),
    # trainer.v1's async modes: the batches asked for from now on are generated with these weights; a rollout group
    # of its own takes them
    StepPhase("update_weights", DRIVER, runs=lambda s: s.plan.mode.asynchronous),
    # the rollout dumps and the run report's samples (trainer.observing.generations), with each token's log-prob
    StepPhase("dump_rollout_generations", DRIVER, lambda s: when(s.has_old and samples_tokens(s.cfg), "old_log_probs")),
    StepPhase(  # the step's data metrics (trainer.observing.metrics.compute_data_metrics)
        "metrics",
        DRIVER,
        lambda s: (
            (*SCORED, "token_level_scores", "token_level_rewards", "advantages", "returns")
            + when(s.plan.use_critic, "values")
            # the sampler's log-probs against the learner's (training/rollout_probs_diff_*)
            + when(s.plan.recompute_old_log_prob and rollout_log_probs(s.cfg), "rollout_log_probs", "old_log_probs")
        ),
        timer=None,
    ),
)
PHASES = {phase.name: phase for phase in STEP_PHASES}


def declare_flows(cfg: Any, plan: Any, table: tuple[StepPhase, ...] = STEP_PHASES) -> dict[str, Dataflow]:
    """Each flow's phases in order, with the per-token keys each reads and writes (only the phases that run): the
    step's (``table``'s), and validation's and ReMax's greedy baseline's (prompts, generation, reward)."""
    s = Step(cfg, plan)
    running = [phase for phase in table if phase.runs(s)]
    step = [phase.declared(s) for phase in running]
    for i, phase in enumerate(running):
        if phase.selects_rows:
            step[i] = _selection(phase.name, step[:i], step[i + 1 :])
    side = (PHASES["prompts"].declared(s), PHASES["gen"].declared(s), Phase("reward", DRIVER, reads=SCORED))
    return {STEP_FLOW: Dataflow.of(tuple(step)), VALIDATION_FLOW: Dataflow.of(side), GREEDY_FLOW: Dataflow.of(side)}


def _selection(name: str, before: list[Phase], after: list[Phase]) -> Phase:
    """A driver phase that keeps (or reorders) rows of every key written before it and read after it."""
    written = dict.fromkeys(key for phase in before for key in phase.writes)
    carried = tuple(key for key in written if any(key in phase.reads for phase in after))
    return Phase(name, DRIVER, reads=carried, writes=carried)
