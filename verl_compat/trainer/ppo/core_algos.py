"""verl's ``verl.trainer.ppo.core_algos``: verl's names and signatures over ColoRL's algorithms (algos/).

Ported code calls these as it calls verl's, and gets verl's numbers (tests/verl_compat/test_algos_equivalence.py):

- The advantage estimators take verl's ``config=`` (the ``algorithm`` config) and ignore other keywords, as verl's
  ``**kwargs`` do. Like verl's, REINFORCE++ reads ``config.gamma`` (a config is required) and pass@k GRPO reads
  ``config.norm_adv_by_std_in_grpo``; the others take ``config`` and do not read it.
- ``compute_value_loss`` takes verl's ``dp_size``, ``batch_num_tokens`` and ``global_batch_size`` (this
  micro-batch's share of the global batch's loss) and returns verl's ``(vf_loss, vf_clipfrac)``.
- ``get_adv_estimator_fn(name)`` gives the estimator of a name, with the signature above; ``get_kl_controller``
  takes verl's ``kl_ctrl`` section; ``kl_penalty_forward`` is the estimator without the straight-through ``+``.
- The rest are algos' own functions, whose signatures are verl's already: ``kl_penalty`` (the ``+`` estimators
  too), ``agg_loss``, ``compute_gae_advantage_return``, the KL controllers, and the estimators whose arguments
  differ from verl's (``compute_gdpo_outcome_advantage``, the optimal-token-baseline ones).

ColoRL's own API differs on purpose where verl's is a mutable registry (``register_adv_est``,
``register_policy_loss``): ``algos.ADV_ESTIMATORS`` / ``algos.POLICY_LOSSES`` are fixed tables, and its losses
return ``(loss, metrics)`` (docs/verl_api.md).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from torch import Tensor

from algos import advantages as _adv
from algos import group_estimators as _groups
from algos import kl as _kl
from algos import losses as _losses
from algos.advantages import (
    compute_gae_advantage_return,
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)
from algos.group_estimators import compute_gdpo_outcome_advantage
from algos.kl import AdaptiveKLController, FixedKLController, kl_penalty
from algos.losses import agg_loss
from algos.registry import estimator_spec

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "agg_loss",
    "compute_gae_advantage_return",
    "compute_gdpo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_opo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_value_loss",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "kl_penalty",
    "kl_penalty_forward",
]


def _taking_config(fn: Callable[..., tuple[Tensor, Tensor]]) -> Callable[..., tuple[Tensor, Tensor]]:
    """``fn`` with verl's ``config=`` and ``**kwargs``, neither read (keywords ``fn`` takes are passed on)."""

    taken = set(inspect.signature(fn).parameters)

    @functools.wraps(fn)
    def estimator(*args: Any, config: Any = None, **kwargs: Any) -> tuple[Tensor, Tensor]:
        return fn(*args, **{name: value for name, value in kwargs.items() if name in taken})

    return estimator


def _option(config: Any, name: str, default: Any = None) -> Any:
    """``config``'s ``name``: an attribute (a dataclass, verl's AlgoConfig) or a mapping key (a DictConfig, a dict)."""
    if isinstance(config, dict) or hasattr(config, "keys"):
        return config.get(name, default)
    return getattr(config, name, default)


compute_grpo_outcome_advantage = _taking_config(_groups.compute_grpo_outcome_advantage)
compute_grpo_vectorized_outcome_advantage = _taking_config(_groups.compute_grpo_vectorized_outcome_advantage)
compute_rloo_outcome_advantage = _taking_config(_groups.compute_rloo_outcome_advantage)
compute_rloo_vectorized_outcome_advantage = _taking_config(_groups.compute_rloo_vectorized_outcome_advantage)
compute_opo_outcome_advantage = _taking_config(_groups.compute_opo_outcome_advantage)
compute_reinforce_plus_plus_baseline_outcome_advantage = _taking_config(
    _groups.compute_reinforce_plus_plus_baseline_outcome_advantage
)
compute_remax_outcome_advantage = _taking_config(_adv.compute_remax_outcome_advantage)


def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, config: Any = None, **kwargs: Any
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ with γ = ``config.gamma`` (algos' ``compute_reinforce_plus_plus_outcome_advantage``)."""
    if config is None:
        raise ValueError("compute_reinforce_plus_plus_outcome_advantage needs config= (it reads config.gamma)")
    gamma = _option(config, "gamma")
    return _adv.compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask, gamma=gamma)


def compute_grpo_passk_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """Pass@k GRPO; as in verl, whether to divide by the group's std is ``config.norm_adv_by_std_in_grpo``
    (default True), not the argument of that name."""
    if config is None:
        raise ValueError("compute_grpo_passk_outcome_advantage needs config= (it reads norm_adv_by_std_in_grpo)")
    norm = bool(_option(config, "norm_adv_by_std_in_grpo", True))
    return _groups.compute_grpo_passk_outcome_advantage(token_level_rewards, response_mask, index, epsilon, norm)


def compute_gpg_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: Any,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    alpha: float = 1.0,
    config: Any = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """GPG, divided by ``f_norm``; ``alpha`` is accepted and recomputed from the batch, as verl's is."""
    advantages, _ = _groups.compute_gpg_outcome_advantage(token_level_rewards, response_mask, index, epsilon)
    advantages = advantages / f_norm
    return advantages, advantages


def get_adv_estimator_fn(name_or_enum: Any) -> Callable[..., tuple[Tensor, Tensor]]:
    """The estimator registered under ``name_or_enum`` (a name or an enum whose value is one), as this module
    gives it; ValueError listing the valid names for an unknown one."""
    name = getattr(name_or_enum, "value", name_or_enum)
    fn_name = estimator_spec(name).fn
    return globals().get(fn_name) or getattr(_groups, fn_name, None) or getattr(_adv, fn_name)


def compute_value_loss(
    vpreds: Tensor,
    returns: Tensor,
    values: Tensor,
    response_mask: Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: float | None = None,
    global_batch_size: float | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[Tensor, Tensor]:
    """The clipped value loss (``algos.compute_value_loss``) as this micro-batch's share of the global batch's,
    and the fraction of tokens whose clipped loss was the larger: ``(vf_loss, vf_clipfrac)``.

    With ``dp_size`` > 1 the global batch's size is required, as in verl: ``batch_num_tokens`` for
    ``token-mean``, ``global_batch_size`` for the seq-mean modes.
    """
    if dp_size > 1 and loss_agg_mode == "token-mean" and batch_num_tokens is None:
        raise ValueError("(global) batch_num_tokens is required when dp_size > 1")
    if dp_size > 1 and loss_agg_mode.startswith("seq-mean") and global_batch_size is None:
        raise ValueError("global_batch_size is required when dp_size > 1")
    global_batch = {"dp_size": dp_size, "batch_num_tokens": batch_num_tokens, "global_batch_size": global_batch_size}
    loss, metrics = _losses.compute_value_loss(
        vpreds, returns, values, response_mask, cliprange_value, loss_agg_mode, loss_scale_factor, global_batch
    )
    return loss, metrics["critic/vf_clipfrac"]


def get_kl_controller(kl_ctrl: Any) -> FixedKLController | AdaptiveKLController:
    """The controller verl's ``algorithm.kl_ctrl`` section describes (``type``, ``kl_coef``, ``target_kl``,
    ``horizon``)."""
    options = {name: _option(kl_ctrl, name) for name in ("target_kl", "horizon") if _option(kl_ctrl, name) is not None}
    return _kl.get_kl_controller(_option(kl_ctrl, "type"), _option(kl_ctrl, "kl_coef"), **options)


def kl_penalty_forward(logprob: Tensor, ref_logprob: Tensor, kl_penalty: str) -> Tensor:
    """The estimator ``kl_penalty`` names, without the straight-through ``+`` (which ``kl_penalty`` adds)."""
    if kl_penalty.endswith("+"):
        raise ValueError(f"kl_penalty_forward takes an estimator without '+', got {kl_penalty!r}")
    return _kl.kl_penalty(logprob, ref_logprob, kl_penalty)
