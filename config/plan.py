"""The step plan: what one PPO step does, computed once from the config and the number of workers.

The driver reads it to decide which phases run and which tensors each worker call moves; the workers read their
per-rank batch sizes from it. Both import it from here (below them), so the decision is made in one place.
Computing the plan checks the batch arithmetic: every error names the keys and values that do not divide.

``declare_flows`` is the one declaration of per-token data: which keys each phase of a step (and of validation,
and of ReMax's greedy baseline) reads and writes. What the driver sends and keeps, what the workers keep for a
later phase and what they return all follow from it (``config.dataflow``). A new per-token quantity is one edit
there: add it to the writes of the phase that makes it and to the reads of each phase that uses it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from algos.advantages import estimator_needs, estimator_needs_critic
from algos.losses import validate_policy_loss
from config.checks import ConfigError, is_int
from config.dataflow import DRIVER, WORKER, Dataflow, Phase, when

ROLLOUT_LOG_PROBS = (
    "needs the rollout's per-token log-probs: set actor_rollout_ref.rollout.calculate_log_probs=true (verl's key)"
)

PROMPT = ("input_ids", "attention_mask", "position_ids")  # the dataloader's left-padded prompts (B, P)
SEQUENCE = PROMPT  # the same names for prompt + response (B, P + R), as the rollout writes them
AGENT_KEYS = ("raw_prompt", "agent_name", "tools_kwargs")  # non-tensors the multi-turn rollout reads, when present
WORKER_ESTIMATOR_INPUTS = ("values", "old_log_probs", "sum_pi_squared")  # what workers compute for an estimator
STEP_FLOW, VALIDATION_FLOW, GREEDY_FLOW = "step", "validation", "greedy_baseline"


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
    """Whether the driver writes sampled responses token by token: the run report's, or verl's rollout dumps."""
    return bool(cfg.trainer.report.enable and cfg.trainer.report.samples_per_step) or bool(cfg.trainer.rollout_data_dir)


def is_single_step(ppo_epochs: int, mini_batch_size: int, rows: int) -> bool:
    """One optimizer step per batch (one epoch, one mini-batch): every micro-batch sees the sampling weights."""
    return ppo_epochs == 1 and mini_batch_size >= rows


def forward_keys(remove_padding: bool) -> tuple[str, ...]:
    """What a forward over the responses reads (``responses``: their width R); packed rows (remove-padding) take
    their positions from the attention mask."""
    return ("input_ids", "attention_mask", *when(not remove_padding, "position_ids"), "responses")


def declare_flows(
    cfg: Any,
    critic: bool,
    old_log_prob: bool,
    ref_log_prob: bool,
    sum_pi_squared: bool,
    from_rollout: bool = False,
    dynamic_sampling: bool = False,
    balance: bool = False,
) -> dict[str, Dataflow]:
    """Each flow's phases in order, with the per-token keys each reads and writes (only the phases that run).

    ``critic``, ``old_log_prob``, ``ref_log_prob``: whether the values, old-log-prob and ref-log-prob phases run;
    ``sum_pi_squared``: whether the old-log-prob forward also writes Σπ²; ``from_rollout``: the rollout's
    log-probs are the old ones (the rollout writes ``old_log_probs``); ``dynamic_sampling``: the phases up to the
    reward run once per generation batch, then the driver's ``filter_groups`` keeps some rows of each
    (``trainer.dynamic_sampling``). It rewrites every key a later phase reads, so those travel to the driver and
    back: the kept rows come from several generation batches, whose tensors no single worker holds. ``balance``:
    the driver reorders the rows (``trainer.balance_batch``) after generation, so what the rollout wrote comes to
    the driver and goes back; with dynamic sampling, after the filter (as verl's DAPO loop), on the rows it keeps.
    """
    actor, algo, rm = cfg.actor_rollout_ref.actor, cfg.algorithm, cfg.reward.reward_model.enable
    policy = forward_keys(cfg.actor_rollout_ref.model.use_remove_padding)  # actor and reference
    value = forward_keys(cfg.critic.model.use_remove_padding)
    estimator = [k for k in WORKER_ESTIMATOR_INPUTS if estimator_needs(algo.adv_estimator, k)]
    prompts = Phase("prompts", DRIVER, writes=PROMPT)  # the dataloader's batch
    sampled = (*when(rollout_log_probs(cfg), "rollout_log_probs"), *when(from_rollout, "old_log_probs"))
    gen = Phase(
        "gen", WORKER, reads=PROMPT, writes=(*SEQUENCE, "responses", "response_mask", *sampled), columns=AGENT_KEYS
    )
    has_old = old_log_prob or from_rollout
    # the reward function (with tool turns, a response's length is its attended tokens), and validation's answers
    scored = ("responses", "response_mask", "attention_mask")
    step = (
        prompts,
        gen,
        *when(balance and not dynamic_sampling, Phase("balance", DRIVER, reads=gen.writes, writes=gen.writes)),
        *when(rm, Phase("rm_score", WORKER, reads=(*SEQUENCE, "response_mask"), writes=("rm_scores",))),
        Phase("reward", DRIVER, reads=(*scored, *when(rm, "rm_scores")), writes=("token_level_scores",)),
        *when(
            old_log_prob,
            Phase(
                "old_log_prob", WORKER, reads=policy, writes=("old_log_probs", *when(sum_pi_squared, "sum_pi_squared"))
            ),
        ),
        *when(ref_log_prob, Phase("ref", WORKER, reads=policy, writes=("ref_log_prob",))),
        *when(critic, Phase("values", WORKER, reads=(*value, "response_mask"), writes=("values",))),
        # the estimator's inputs; the in-reward KL penalty and actor/ref_kl read both log-probs when both exist
        Phase(
            "adv",
            DRIVER,
            reads=(
                "token_level_scores",
                "response_mask",
                *when(critic, "values"),
                *estimator,
                *when(has_old and ref_log_prob, "old_log_probs", "ref_log_prob"),
            ),
            writes=("token_level_rewards", "advantages", "returns"),
        ),
        *when(critic, Phase("update_critic", WORKER, reads=(*value, "response_mask", "values", "returns"))),
        # without old_log_probs the update is on-policy (see is_single_step); the policy loss may need more
        Phase(
            "update_actor",
            WORKER,
            reads=(
                *policy,
                "response_mask",
                "advantages",
                *when(has_old, "old_log_probs"),
                *when(uses_ref_log_prob(actor), "ref_log_prob"),
                *validate_policy_loss(actor.policy_loss.loss_mode).needs,
            ),
        ),
        Phase(
            "metrics",
            DRIVER,
            reads=(
                "responses",
                "response_mask",
                "attention_mask",
                "token_level_scores",
                "token_level_rewards",
                "advantages",
                "returns",
                *when(critic, "values"),
            ),
        ),
        # the sampled responses of the generation dumps and the run report show each token's log-prob
        *when(has_old and samples_tokens(cfg), Phase("dump_rollout_generations", DRIVER, reads=("old_log_probs",))),
    )
    if dynamic_sampling:  # after the reward (prompts, gen, rm_score, reward): the filter selects the rows
        cut = 3 + int(rm)
        selection = _selection("filter_groups", step[:cut], step[cut:])
        ordered = when(balance, Phase("balance", DRIVER, reads=selection.writes, writes=selection.writes))
        step = (*step[:cut], selection, *ordered, *step[cut:])
    side = (prompts, gen, Phase("reward", DRIVER, reads=scored))
    return {STEP_FLOW: Dataflow.of(step), VALIDATION_FLOW: Dataflow.of(side), GREEDY_FLOW: Dataflow.of(side)}


def _selection(name: str, before: tuple[Phase, ...], after: tuple[Phase, ...]) -> Phase:
    """A driver phase that keeps some rows of every key written ``before`` it and read ``after`` it."""
    written = dict.fromkeys(key for phase in before for key in phase.writes)
    carried = tuple(key for key in written if any(key in phase.reads for phase in after))
    return Phase(name, DRIVER, reads=carried, writes=carried)


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
    compute_greedy_baseline: bool  # each prompt's greedy response is generated and scored (ReMax's baseline)
    compute_sum_pi_squared: bool  # the old-log-prob forward also returns Σπ² (the optimal token baseline's)
    balance_batch: bool  # the driver reorders each step's rows to balance the workers' tokens (trainer.balance)
    actor_mini_batch_size: int
    critic_mini_batch_size: int  # 0 without a critic
    gen_batch_size: int  # prompts per generation batch (data.gen_batch_size, else data.train_batch_size)
    # algorithm.filter_groups.metric when groups are filtered (else None); with it, or with generation batches of
    # another size than the training batch, a step draws generation batches until it has data.train_batch_size
    # prompts (trainer.dynamic_sampling)
    filter_metric: str | None
    dynamic_sampling: bool
    flows: dict[str, Dataflow] = field(hash=False)  # declare_flows: where each flow's tensors live and travel


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
    critic = uses_critic(cfg)
    use_reference_policy = bool(actor.use_kl_loss or algo.use_kl_in_reward)
    lora = cfg.actor_rollout_ref.model.lora_rank > 0
    # the estimator reading old log-probs (or Σπ², computed with them) needs them before the update
    needs_old = estimator_needs(algo.adv_estimator, "old_log_probs")
    on_policy = is_single_step(actor.ppo_epochs, actor.ppo_mini_batch_size, data.train_batch_size)
    own_log_probs = not needs_old and actor.skip_on_policy_old_log_prob and not algo.use_kl_in_reward and on_policy
    sum_pi_squared = estimator_needs(algo.adv_estimator, "sum_pi_squared") or actor.calculate_sum_pi_squared
    # the rollout's log-probs are the old ones, unless the forward must run anyway (Σπ²) or the multi-turn loop
    # samples (its tool tokens have no sampled log-prob)
    from_rollout = rollout_log_probs(cfg) and not own_log_probs and not sum_pi_squared
    recompute = not (own_log_probs or from_rollout)
    ref_log_prob = bool(algo.use_kl_in_reward or uses_ref_log_prob(actor))
    balance = bool(cfg.trainer.balance_batch) and n_workers > 1  # one worker: nothing to balance
    if balance and actor.use_prefix_grouper and data.train_batch_size % n_workers:
        raise ConfigError(
            f"trainer.balance_batch=true with actor_rollout_ref.actor.use_prefix_grouper=true places whole prompt "
            f"groups: data.train_batch_size={data.train_batch_size} must be a multiple of the {n_workers} workers"
        )
    arr = "actor_rollout_ref"
    _require_micro(
        f"{arr}.rollout.log_prob_micro_batch_size_per_gpu",
        rollout.log_prob_micro_batch_size_per_gpu,
        recompute and not rollout.log_prob_use_dynamic_bsz,
        f"{arr}.rollout.log_prob_use_dynamic_bsz",
    )
    ref = cfg.actor_rollout_ref.ref
    _require_micro(
        f"{arr}.ref.log_prob_micro_batch_size_per_gpu",
        ref.log_prob_micro_batch_size_per_gpu,
        ref_log_prob and not ref.log_prob_use_dynamic_bsz,
        f"{arr}.ref.log_prob_use_dynamic_bsz",
    )
    _require_micro(
        "critic.forward_micro_batch_size_per_gpu",
        cfg.critic.forward_micro_batch_size_per_gpu,
        critic and not cfg.critic.use_dynamic_bsz,
        "critic.use_dynamic_bsz",
    )
    return StepPlan(
        n_workers=n_workers,
        use_critic=critic,
        use_reference_policy=use_reference_policy,
        ref_in_actor=uses_full_kl(actor) or (use_reference_policy and lora),
        recompute_old_log_prob=recompute,
        old_log_prob_from_rollout=from_rollout,
        compute_ref_log_prob=ref_log_prob,
        compute_greedy_baseline=estimator_needs(algo.adv_estimator, "reward_baselines"),
        compute_sum_pi_squared=sum_pi_squared,
        balance_batch=balance,
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
        filter_metric=filter_metric,
        dynamic_sampling=dynamic_sampling,
        flows=declare_flows(
            cfg,
            critic=critic,
            old_log_prob=recompute,
            ref_log_prob=ref_log_prob,
            sum_pi_squared=sum_pi_squared,
            from_rollout=from_rollout,
            dynamic_sampling=dynamic_sampling,
            balance=balance,
        ),
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
    """verl's rule: a micro-batch size has no default; a phase that runs needs it, or micro-batches by tokens."""
    if needed and value is None:
        raise ConfigError(
            f"{key}=null: set the sequences per forward on one worker (e.g. {key}=8), "
            f"or micro-batch by token budget with {dynamic_key}=true"
        )


def _check_estimator(cfg: Any) -> None:
    estimator, n = cfg.algorithm.adv_estimator, cfg.actor_rollout_ref.rollout.n
    loss_mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    if "rollout_log_probs" in validate_policy_loss(loss_mode).needs and not rollout_log_probs(cfg):
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
            "prompt; each is alone in its group, which (as in verl) counts as mean 0, std 1",
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
            "no spread to measure and is always kept (verl's rule), so nothing is filtered",
            stacklevel=3,
        )
    return gen_batch_size, groups.metric
