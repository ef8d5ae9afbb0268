"""The step plan: what one PPO step does, computed once from the config and the number of workers.

The driver reads it to decide which phases run and which tensors each worker call moves; the workers read their
per-rank batch sizes from it. Both import it from here (below them), so the decision is made in one place.
Computing the plan checks the batch arithmetic: every error names the keys and values that do not divide.

The plan's decisions (which phases run, per-rank batch sizes) select the entries of the phase table
(``planner.phases``), whose declared reads and writes give each flow's routes (``planner.phases.declare_flows``):
what the driver sends and keeps, what the workers keep for a later phase and what they return. A new per-token
quantity is one edit there: add it to the writes of the phase that makes it and to the reads of each phase that
uses it.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

from algos.registry import estimator_needs, estimator_needs_critic, policy_loss_spec
from config.checks import ConfigError, is_int
from planner.batching import PHASE_BATCHES
from planner.dataflow import Dataflow
from planner.phases import PHASES, STEP_FLOW, declare_flows, rollout_log_probs, uses_full_kl, uses_ref_log_prob
from planner.trainer_modes import TrainerMode, trainer_mode

ROLLOUT_LOG_PROBS = "needs the rollout's per-token log-probs: set actor_rollout_ref.rollout.calculate_log_probs=true"


def is_single_step(ppo_epochs: int, mini_batch_size: int, rows: int) -> bool:
    """One optimizer step per batch (one epoch, one mini-batch): every micro-batch sees the sampling weights."""
    return ppo_epochs == 1 and mini_batch_size >= rows


@dataclass(frozen=True)
class StepPlan:
    """Which phases a step runs and with what; ``*_mini_batch_size`` are sequences per optimizer step per rank."""

    n_workers: int
    use_critic: bool
    use_reference_policy: bool  # a reference model exists: a KL loss or the in-reward KL
    # the actor's process holds the reference: kl_loss_type=full reads it in the update; a LoRA actor is its
    # own reference (its module with the adapters disabled), so the base model is held once
    ref_in_actor: bool
    recompute_old_log_prob: bool  # the old-log-prob forward runs (else: the rollout's, or the update's own)
    # rollout.calculate_log_probs: the rollout's log-probs of its samples are the old log-probs (no forward)
    old_log_prob_from_rollout: bool
    compute_ref_log_prob: bool  # the ref log-prob forward runs (in-reward KL or a sampled-token KL loss)
    compute_teacher: bool  # the distillation teachers score the responses (distillation.enabled)
    compute_greedy_baseline: bool  # each prompt's greedy response is generated and scored (ReMax's baseline)
    compute_sum_pi_squared: bool  # the old-log-prob forward also returns Σπ² (the optimal token baseline's)
    balance_batch: bool  # the driver reorders each step's rows to balance the workers' tokens (trainer.running.balance)
    actor_mini_batch_size: int
    critic_mini_batch_size: int  # 0 without a critic
    gen_batch_size: int  # prompts per generation batch (data.gen_batch_size, else data.train_batch_size)
    gen_rows: int  # sequences each worker generates at once: its share of a generation batch's × rollout.n
    # algorithm.filter_groups.metric when groups are filtered (else None); with it, or with generation batches of
    # another size than the training batch, a step draws generation batches until it has data.train_batch_size
    # prompts (trainer.running.dynamic_sampling)
    filter_metric: str | None
    dynamic_sampling: bool
    flows: dict[str, Dataflow] = field(hash=False)  # declare_flows: where each flow's tensors live and travel
    mode: TrainerMode = TrainerMode()  # trainer.v1: sync, or generation ahead of training (planner.trainer_modes)

    @property
    def step_phases(self) -> tuple[str, ...]:
        """The names of the phases a step of this plan runs, in the table's order."""
        return tuple(p.name for p in self.flows[STEP_FLOW].phases)

    def runs(self, phase: str) -> bool:
        """Whether a step of this plan runs ``phase`` (a name of ``planner.phases.STEP_PHASES``)."""
        if phase not in PHASES:
            raise KeyError(f"no phase {phase!r} in planner.phases.STEP_PHASES: {list(PHASES)}")
        return phase in self.step_phases


def num_workers(cfg: Any) -> int:
    """Worker processes (one per GPU, or per CPU slot on CPU): ``n_gpus_per_node × nnodes``."""
    return cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes


def uses_critic(cfg: Any) -> bool:
    """critic.enable, or when it is null, whether the advantage estimator needs values."""
    enable = cfg.critic.enable
    return estimator_needs_critic(cfg.algorithm.adv_estimator) if enable is None else bool(enable)


def make_plan(cfg: Any, n_workers: int) -> StepPlan:
    """The plan of ``cfg`` (a ``PPOConfig``) on ``n_workers`` data-parallel workers; ConfigError if impossible."""
    if not is_int(n_workers) or n_workers < 1:
        raise ConfigError(f"n_workers={n_workers}: must be a positive integer")
    data, rollout, actor, algo = cfg.data, cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor, cfg.algorithm
    sequences = data.train_batch_size * rollout.n
    if sequences % n_workers:
        raise ConfigError(
            f"data.train_batch_size={data.train_batch_size} × actor_rollout_ref.rollout.n={rollout.n} = {sequences} "
            f"sequences per step cannot be split evenly across {n_workers} workers (trainer.n_gpus_per_node × "
            f"trainer.nnodes); make the product a multiple of {n_workers}"
        )
    _check_estimator(cfg)
    gen_batch_size, filter_metric = _check_dynamic_sampling(cfg, n_workers)
    dynamic_sampling = filter_metric is not None or gen_batch_size != data.train_batch_size
    mode = trainer_mode(cfg, n_workers)
    _check_async(cfg, mode, dynamic_sampling)
    critic = uses_critic(cfg)
    use_reference_policy = bool(actor.use_kl_loss or algo.use_kl_in_reward)
    recompute, from_rollout, sum_pi_squared = _old_log_probs(cfg, mode.asynchronous)
    plan = StepPlan(
        n_workers=n_workers,
        use_critic=critic,
        use_reference_policy=use_reference_policy,
        ref_in_actor=uses_full_kl(actor) or (use_reference_policy and cfg.actor_rollout_ref.model.lora_rank > 0),
        recompute_old_log_prob=recompute,
        old_log_prob_from_rollout=from_rollout,
        compute_ref_log_prob=bool(algo.use_kl_in_reward or uses_ref_log_prob(actor)),
        compute_teacher=cfg.distillation.enabled,
        compute_greedy_baseline=estimator_needs(algo.adv_estimator, "reward_baselines"),
        compute_sum_pi_squared=sum_pi_squared,
        balance_batch=_balance(cfg, n_workers),
        actor_mini_batch_size=_mini_batch_per_rank(
            "actor_rollout_ref.actor",
            actor,
            ("actor_rollout_ref.rollout.n", rollout.n),
            data.train_batch_size,
            n_workers,
        ),
        critic_mini_batch_size=_mini_batch_per_rank(
            "critic", cfg.critic, ("critic.rollout_n", cfg.critic.rollout_n), data.train_batch_size, n_workers
        )
        if critic
        else 0,
        gen_batch_size=gen_batch_size,
        # partial rollouts decode every group in flight at once: the step's and num_warmup_batches' more
        gen_rows=gen_batch_size * rollout.n * (1 + mode.lookahead if mode.partial else 1) // n_workers,
        filter_metric=filter_metric,
        dynamic_sampling=dynamic_sampling,
        flows={},
        mode=mode,
    )
    plan = dataclasses.replace(plan, flows=declare_flows(cfg, plan))  # the flows follow the plan's decisions
    _check_micro_batches(cfg, plan)
    return plan


def rollout_plan(cfg: Any, plan: StepPlan) -> StepPlan:
    """The plan on a rollout group of its own (``separate_async``): its workers generate a step's batch and hold the
    actor alone (no critic, no reference, no teacher)."""
    workers = plan.mode.rollout_workers
    rows = cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n // workers
    alone = dict(use_critic=False, use_reference_policy=False, ref_in_actor=False, compute_teacher=False)
    return dataclasses.replace(plan, n_workers=workers, gen_rows=rows, **alone)


def _old_log_probs(cfg: Any, ahead: bool) -> tuple[bool, bool, bool]:
    """Where the old log-probs come from: (the forward recomputes them, they are the rollout's, Σπ² is needed);
    ``ahead``: generation runs ahead of training (trainer.v1's async modes)."""
    data, rollout, actor, algo = cfg.data, cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor, cfg.algorithm
    # the estimator reading old log-probs (or Σπ², computed with them) needs them before the update
    needs_old = estimator_needs(algo.adv_estimator, "old_log_probs")
    on_policy = is_single_step(actor.ppo_epochs, actor.ppo_mini_batch_size, data.train_batch_size)
    own_log_probs = not needs_old and actor.skip_on_policy_old_log_prob and not algo.use_kl_in_reward and on_policy
    sum_pi_squared = estimator_needs(algo.adv_estimator, "sum_pi_squared") or actor.calculate_sum_pi_squared
    # the rollout's log-probs are the old ones, unless the forward must run anyway (Σπ²); vLLM samples with other
    # kernels than the actor's, so there they are the old ones only in bypass mode, and the forward
    # runs beside them (its gap to them is logged: trainer.observing.metrics.rollout_probs_diff)
    # generated ahead of the update, they are an older policy's: the old ones only in bypass mode too
    same_kernels = (rollout.name != "vllm" and not ahead) or actor.policy_loss.loss_mode == "bypass_mode"
    if not same_kernels and rollout_log_probs(cfg):
        own_log_probs = False
    from_rollout = rollout_log_probs(cfg) and same_kernels and not own_log_probs and not sum_pi_squared
    return not (own_log_probs or from_rollout), from_rollout, sum_pi_squared


def _check_async(cfg: Any, mode: TrainerMode, dynamic_sampling: bool) -> None:
    """What the async modes cannot do: generation batches other than the step's (dynamic sampling), and ReMax's
    greedy baseline (generated by the policy being trained, in the step)."""
    if not mode.asynchronous:
        return
    key = f"trainer.v1.trainer_mode={mode.mode}"
    if dynamic_sampling:
        raise ConfigError(
            f"{key}: generation ahead of training takes whole training batches; unset algorithm.filter_groups.enable "
            "and data.gen_batch_size, or use trainer.v1.trainer_mode=sync"
        )
    if estimator_needs(cfg.algorithm.adv_estimator, "reward_baselines"):
        raise ConfigError(
            f"{key}: algorithm.adv_estimator={cfg.algorithm.adv_estimator} generates a greedy baseline with the "
            "policy being trained; use trainer.v1.trainer_mode=sync"
        )


def _balance(cfg: Any, n_workers: int) -> bool:
    """trainer.balance_batch on more than one worker (one has nothing to balance)."""
    balance = bool(cfg.trainer.balance_batch) and n_workers > 1
    if balance and cfg.actor_rollout_ref.actor.use_prefix_grouper and cfg.data.train_batch_size % n_workers:
        raise ConfigError(
            f"trainer.balance_batch=true with actor_rollout_ref.actor.use_prefix_grouper=true places whole prompt "
            f"groups: data.train_batch_size={cfg.data.train_batch_size} must be a multiple of the {n_workers} workers"
        )
    return balance


def _check_micro_batches(cfg: Any, plan: StepPlan) -> None:
    """Each worker phase that runs and micro-batches by sequences needs its micro-batch size (its
    ``planner.batching.PHASE_BATCHES`` entry): none has a default."""
    for phase in plan.flows[STEP_FLOW].phases:
        batching = PHASE_BATCHES.get(phase.name)
        if batching is None or batching.section is None or batching.mini is not None:  # updates: _mini_batch_per_rank
            continue
        section = batching.config(cfg)
        _require_micro(
            f"{batching.section}.{batching.micro}",
            getattr(section, batching.micro),
            not batching.is_dynamic(section),
            f"{batching.section}.{batching.dynamic}",
        )


def _mini_batch_per_rank(prefix: str, role: Any, n: tuple[str, int], train_batch_size: int, n_workers: int) -> int:
    """mini | train_batch_size;  per-rank mini = mini·n / n_workers ∈ ℕ;  min(micro, it) | per-rank mini."""
    (n_key, n_value), mini, micro = n, role.ppo_mini_batch_size, role.ppo_micro_batch_size_per_gpu
    _require_micro(
        f"{prefix}.ppo_micro_batch_size_per_gpu", micro, not role.use_dynamic_bsz, f"{prefix}.use_dynamic_bsz"
    )
    mini_text = f"{prefix}.ppo_mini_batch_size={mini}"
    if train_batch_size % mini:
        raise ConfigError(f"{mini_text}: must divide data.train_batch_size={train_batch_size} (both count prompts)")
    per_rank, remainder = divmod(mini * n_value, n_workers)
    if remainder:
        raise ConfigError(
            f"{mini_text} × {n_key}={n_value} = {mini * n_value} sequences per mini-batch cannot be "
            f"split evenly across {n_workers} workers"
        )
    if not role.use_dynamic_bsz and per_rank % min(micro, per_rank):  # a larger micro-batch is the mini-batch
        raise ConfigError(
            f"{prefix}.ppo_micro_batch_size_per_gpu={micro}: must divide the {per_rank} sequences "
            f"of each worker's mini-batch ({mini_text} × {n_key}={n_value} / {n_workers} workers)"
        )
    return per_rank


def _require_micro(key: str, value: int | None, needed: bool, dynamic_key: str) -> None:
    """A micro-batch size has no default; a phase that runs needs it, or micro-batches by tokens."""
    if needed and value is None:
        raise ConfigError(
            f"{key}=null: set the sequences per forward on one worker (e.g. {key}=8), "
            f"or micro-batch by token budget with {dynamic_key}=true"
        )


def _check_estimator(cfg: Any) -> None:
    estimator, n = cfg.algorithm.adv_estimator, cfg.actor_rollout_ref.rollout.n
    loss_mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    if "rollout_log_probs" in policy_loss_spec(loss_mode).needs and not rollout_log_probs(cfg):
        raise ConfigError(f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}: {ROLLOUT_LOG_PROBS}")
    corr = cfg.algorithm.rollout_correction
    for key in ("bypass_mode", "rollout_is", "rollout_rs"):
        if getattr(corr, key) and not rollout_log_probs(cfg):
            raise ConfigError(f"algorithm.rollout_correction.{key}={getattr(corr, key)}: {ROLLOUT_LOG_PROBS}")
    # ColoRL's rollout is the pre-update policy: its log-probs are the old ones (bypass mode) whenever computed;
    # weights, rejection and the reinforce loss are the bypass loss's, which must then be the one configured
    corrected = corr.rollout_is or corr.rollout_rs or (corr.bypass_mode and corr.loss_type != "ppo_clip")
    if corrected and loss_mode != "bypass_mode":
        raise ConfigError(
            f"algorithm.rollout_correction (rollout_is={corr.rollout_is}, rollout_rs={corr.rollout_rs}, "
            f"loss_type={corr.loss_type}): ColoRL's rollout is the pre-update policy, so its log-probs are the old "
            "ones: set algorithm.rollout_correction.bypass_mode=true (the bypass loss applies them)"
        )
    if estimator == "grpo_passk" and n < 2:  # pass@k's baseline is the group's best other response
        raise ConfigError(
            f"actor_rollout_ref.rollout.n={n}: algorithm.adv_estimator={estimator} compares the responses to one "
            "prompt, so it needs rollout.n > 1"
        )
    if estimator_needs(estimator, "index") and n < 2:  # the baseline comes from the prompt's group
        warnings.warn(
            f"actor_rollout_ref.rollout.n={n}: algorithm.adv_estimator={estimator} compares the responses to one "
            "prompt; each is alone in its group, which counts as mean 0, std 1",
            stacklevel=3,
        )
    needs_critic = estimator_needs_critic(estimator)
    if cfg.critic.enable is False and needs_critic:
        raise ConfigError(
            f"critic.enable=false: algorithm.adv_estimator={estimator} needs a critic's values; "
            "set critic.enable=true or null"
        )
    if cfg.critic.enable is True and not needs_critic:
        warnings.warn(
            f"critic.enable=true but algorithm.adv_estimator={estimator} does not use values; "
            "the critic will be trained for nothing",
            stacklevel=3,
        )


def _check_dynamic_sampling(cfg: Any, n_workers: int) -> tuple[int, str | None]:
    """(prompts per generation batch, the filter's metric or None), after checking that a generation batch's
    sequences divide over the workers and that the metric can be computed before the KL phases."""
    data, n, groups = cfg.data, cfg.actor_rollout_ref.rollout.n, cfg.algorithm.filter_groups
    gen_batch_size = data.gen_batch_size or data.train_batch_size
    if gen_batch_size * n % n_workers:
        raise ConfigError(
            f"data.gen_batch_size={gen_batch_size} × actor_rollout_ref.rollout.n={n} = {gen_batch_size * n} "
            f"sequences per generation batch cannot be split evenly across {n_workers} workers; make the product a "
            f"multiple of {n_workers}"
        )
    if not groups.enable:
        return gen_batch_size, None
    if groups.metric == "seq_final_reward" and cfg.algorithm.use_kl_in_reward:
        raise ConfigError(
            "algorithm.filter_groups.metric=seq_final_reward: with algorithm.use_kl_in_reward=true it would need the "
            "KL phases before the filter, which ColoRL runs after it; use seq_reward (the same without the KL)"
        )
    if n == 1:
        warnings.warn(
            "algorithm.filter_groups.enable=true with actor_rollout_ref.rollout.n=1: a group of one response has "
            "no spread to measure and is always kept, so nothing is filtered",
            stacklevel=3,
        )
    return gen_batch_size, groups.metric
