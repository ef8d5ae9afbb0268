"""What sizes each worker phase's batch on one worker: ``PHASE_BATCHES``, keyed by the phase's name.

Its readers: the step plan's check that each micro-batch size a phase needs is set (``planner.plan``), the memory
estimate (``trainer.preflight.memory_phases``), the dry run's batch table (``trainer.preflight.dry_run``) and the
out-of-memory advice (``trainer.running.faults``). Every worker phase of ``planner.phases.STEP_PHASES`` has an entry
(``tests/trainer/test_phases.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from config.tree import ARR
from planner.trainer_modes import partial_rollouts


@dataclass(frozen=True)
class Batching:
    """What sizes a worker phase's batch on one worker. Every row at once (``rows``: the ``StepPlan`` field of their
    number; ``rows_key``: the keys that set it, for a config), or micro-batches of ``micro`` rows (fields of the
    ``section`` a config's ``config`` gives; ``section`` is its key, for messages), of ``budget`` tokens when the
    ``dynamic`` field is true; an update first splits the rows into the plan's per-rank ``mini`` batches (a
    ``StepPlan`` field), ``ppo_epochs`` times."""

    section: str | None = None
    config: Callable[[Any], Any] | None = None
    micro: str | None = None
    dynamic: str | None = None
    budget: str | None = None
    mini: str | None = None
    rows: str | None = None
    rows_key: Callable[[Any], str] | None = None

    def is_dynamic(self, section: Any) -> bool:
        """Whether ``section`` (this phase's config section) micro-batches by token budget."""
        return self.dynamic is not None and bool(getattr(section, self.dynamic))

    def key(self, cfg: Any) -> str:
        """The key that sizes one forward of ``cfg``'s: the token budget's when dynamic, else the micro-batch's."""
        if self.section is None:
            return self.rows_key(cfg)
        return f"{self.section}.{self.budget if self.is_dynamic(self.config(cfg)) else self.micro}"

    def keys(self) -> str:
        """Both keys, for advice that holds whichever is on."""
        dynamic = f" ({self.budget} with {self.dynamic})" if self.dynamic else ""
        return f"{self.section}.{self.micro}{dynamic}"


def _generation_batch(cfg: Any) -> str:
    """What sets the rows a worker generates at once: the prompts of a generation batch (dynamic sampling's, when
    data.gen_batch_size is set) × the responses to each; with partial rollouts, of every batch in flight."""
    rows = f"data.{'gen' if cfg.data.gen_batch_size else 'train'}_batch_size × {ARR}.rollout.n"
    return f"{rows} × (1 + trainer.v1.colocate_async.num_warmup_batches)" if partial_rollouts(cfg) else rows


def _log_prob(section: str, config: Callable[[Any], Any]) -> Batching:
    return Batching(
        section,
        config,
        "log_prob_micro_batch_size_per_gpu",
        "log_prob_use_dynamic_bsz",
        "log_prob_max_token_len_per_gpu",
    )


def _update(section: str, config: Callable[[Any], Any], mini: str) -> Batching:
    micro, budget = "ppo_micro_batch_size_per_gpu", "ppo_max_token_len_per_gpu"
    return Batching(section, config, micro, "use_dynamic_bsz", budget, mini)


def _rollout(cfg: Any) -> Any:
    return cfg.actor_rollout_ref.rollout


PHASE_BATCHES: dict[str, Batching] = {
    "gen": Batching(rows="gen_rows", rows_key=_generation_batch),
    "rm_score": Batching("reward.reward_model", lambda cfg: cfg.reward.reward_model, "micro_batch_size_per_gpu"),
    "old_log_prob": _log_prob(f"{ARR}.rollout", _rollout),
    "ref": _log_prob(f"{ARR}.ref", lambda cfg: cfg.actor_rollout_ref.ref),
    "teacher": _log_prob(f"{ARR}.rollout", _rollout),  # micro-batched as the old log-probs' (workers.compute.teacher)
    "values": Batching(
        "critic",
        lambda cfg: cfg.critic,
        "forward_micro_batch_size_per_gpu",
        "use_dynamic_bsz",
        "forward_max_token_len_per_gpu",
    ),
    "update_critic": _update("critic", lambda cfg: cfg.critic, "critic_mini_batch_size"),
    "update_actor": _update(f"{ARR}.actor", lambda cfg: cfg.actor_rollout_ref.actor, "actor_mini_batch_size"),
}
