"""Rollout correction (``bypass_mode``): train on the rollout engine's own log-probs.

In bypass mode the old policy is the one that sampled, π_rollout, so no old-log-prob forward runs. Truncated
importance weights w = π/π_rollout (per token or per sequence) and rejection of tokens or sequences whose
divergence from π_rollout is too large correct for the gap; the loss is then PPO's clip (``ppo_clip``) or the
importance-weighted policy gradient (``reinforce``). Liu et al. 2025, "When Speed Kills Stability".
All log-prob tensors are (bs, response_length); metrics are named ``rollout_corr/…``.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor

from algos.host_sync import host_read
from algos.policy_losses import PolicyLossTerms, compute_policy_loss_vanilla
from algos.stats import masked_mean, masked_sum

SAFETY_BOUND = 20.0  # |log w| is clamped here before exponentiating
RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)


def _require_valid(mask: Tensor) -> None:
    if not host_read("rollout_correction.any_valid", mask.any(), meta_value=True):
        raise ValueError("response_mask must contain at least one valid token")


def parse_is_threshold(spec: str | float) -> tuple[float, float | None]:
    """``rollout_is_threshold`` -> (upper, lower): a number truncates at it (TIS); ``"lower_upper"`` zeroes the
    weights outside [lower, upper] (IcePop)."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise ValueError(f"rollout_is_threshold={spec!r}: must be a number or a 'lower_upper' string")
    lower_text, _, upper_text = str(spec).strip().rpartition("_")
    try:
        upper, lower = float(upper_text), float(lower_text) if lower_text else None
    except ValueError:
        raise ValueError(f"rollout_is_threshold={spec!r}: must be a number or a 'lower_upper' string") from None
    if upper <= 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"rollout_is_threshold={spec!r}: needs 0 < lower <= upper")
    return upper, lower


def parse_rs_thresholds(options: list[str], spec: str | float | None) -> dict[str, tuple[float | None, float]]:
    """``rollout_rs_threshold`` -> {option: (lower, upper)}: one entry per option, or one for all (comma-separated).

    The k1 options bound a ratio from both sides (``"lower_upper"``, or an upper u meaning [1/u, u]); the others
    take one upper bound.
    """
    specs = [part.strip() for part in str(spec).split(",") if part.strip()] if spec is not None else []
    if len(specs) not in (1, len(options)):
        raise ValueError(f"rollout_rs_threshold={spec!r}: give one threshold, or one per rollout_rs option {options}")
    thresholds = {}
    for option, text in zip(options, specs * len(options) if len(specs) == 1 else specs):
        lower_text, _, upper_text = text.rpartition("_")
        if lower_text and not option.endswith("k1"):
            raise ValueError(f"rollout_rs_threshold for {option} is one upper bound, got {text!r}")
        upper = float(upper_text)
        lower = (float(lower_text) if lower_text else 1.0 / upper) if option.endswith("k1") else None
        if upper <= 0 or (lower is not None and not 0 < lower <= upper):
            raise ValueError(f"rollout_rs_threshold for {option}: needs 0 < lower <= upper, got {text!r}")
        thresholds[option] = (lower, upper)
    return thresholds


def _masked_extreme(values: Tensor, mask: Tensor, largest: bool) -> Tensor:
    fill = float("-inf") if largest else float("inf")
    masked = values.masked_fill(~mask.bool(), fill)
    return masked.max() if largest else masked.min()


def _clamped_std(values: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    """√(E[x²] − E[x]²) of the masked values clamped to [low, high]; 0 for fewer than 2 tokens."""
    clamped = values.clamp(min=low, max=high)
    var = masked_mean(clamped.square(), mask) - masked_mean(clamped, mask).square()
    return torch.where(mask.sum() > 1, var.clamp(min=0.0).sqrt(), 0.0)  # kept on the device: no branch on the count


def _batch_mean(values: Tensor, weights: Tensor) -> Tensor:
    """Σ values·weights / Σ weights, over every data-parallel rank when torch.distributed runs."""
    sums = torch.stack([(values * weights).sum(), weights.sum()])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(sums)
    return sums[0] / sums[1].clamp_min(1e-8)


def rollout_is_weights(
    log_ratio: Tensor,
    response_mask: Tensor,
    rollout_is: str = "token",
    rollout_is_threshold: str | float = 2.0,
    rollout_is_batch_normalize: bool = False,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Importance weights w = exp(log π − log π_rollout) per token, or per sequence exp(Σ_t ·), detached.

    Truncated at the upper threshold (TIS), or zeroed outside [lower, upper] (IcePop, ``"lower_upper"``);
    ``rollout_is_batch_normalize`` rescales them to mean 1 over the batch. Returns (weights, ``rollout_is_*``
    metrics before normalisation).
    """
    upper, lower = parse_is_threshold(rollout_is_threshold)
    if rollout_is == "token":
        log_w = log_ratio
    elif rollout_is == "sequence":
        log_w = masked_sum(log_ratio, response_mask, dim=-1).unsqueeze(-1)
    else:
        raise ValueError(f"rollout_is={rollout_is!r}: must be one of token, sequence")
    raw = torch.exp(log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio) * response_mask
    weights = raw.clamp(max=upper) if lower is None else torch.where((raw >= lower) & (raw <= upper), raw, 0.0)
    metrics = _is_metrics(weights, raw, log_w, response_mask, rollout_is, upper, lower)
    weights = weights.detach()
    if rollout_is_batch_normalize:
        if rollout_is == "token":
            mean = _batch_mean(weights, response_mask.to(weights.dtype))
        else:
            mean = _batch_mean(masked_mean(weights, response_mask, dim=-1), (response_mask.sum(-1) > 0).float())
        factor = torch.where(mean > 1e-8, mean, torch.ones_like(mean))  # no normalising by a vanishing mean
        weights = weights / factor
        metrics["rollout_is_batch_norm_factor"] = factor
    return weights, metrics


def _is_metrics(
    weights: Tensor, raw: Tensor, log_w: Tensor, mask: Tensor, level: str, upper: float, lower: float | None
) -> dict[str, Tensor]:
    """The ``rollout_is_*`` diagnostics: extremes, fractions outside the bounds, std, effective sample size."""
    _require_valid(mask)
    floor = 1.0 / upper if lower is None else lower
    m = {"rollout_is_mean": masked_mean(weights, mask)}
    if level == "sequence":
        m["rollout_is_max"] = torch.exp(log_w.max().clamp(max=SAFETY_BOUND))
        m["rollout_is_min"] = torch.exp(log_w.min())
        m["rollout_is_ratio_fraction_high"] = (log_w > math.log(upper)).float().mean()
        m["rollout_is_ratio_fraction_low"] = (log_w < math.log(floor)).float().mean()
    else:
        m["rollout_is_ratio_fraction_high"] = masked_mean((raw > upper).float(), mask)
        m["rollout_is_ratio_fraction_low"] = masked_mean((raw < floor).float(), mask)
        m["rollout_is_max"] = _masked_extreme(weights, mask, largest=True)
        m["rollout_is_min"] = _masked_extreme(weights, mask, largest=False)
    m["rollout_is_std"] = _clamped_std(weights, mask, 0.0, upper)
    bounded = weights.clamp(min=0.0, max=upper)
    m["rollout_is_eff_sample_size"] = 1.0 / masked_mean((bounded / (masked_mean(bounded, mask) + 1e-8)).square(), mask)
    seq = masked_mean(weights, mask, dim=-1)
    raw_seq = masked_mean(raw, mask, dim=-1)
    m.update(
        rollout_is_seq_mean=seq.mean(),
        rollout_is_seq_std=seq.std() if seq.numel() > 1 else seq.new_zeros(()),
        rollout_is_seq_max=seq.max(),
        rollout_is_seq_min=seq.min(),
        rollout_is_seq_max_deviation=(seq - 1.0).abs().max(),
        rollout_is_seq_fraction_high=(raw_seq > upper).float().mean(),
        rollout_is_seq_fraction_low=(raw_seq < floor).float().mean(),
    )
    if lower is not None:
        m["rollout_is_oob_ratio"] = masked_mean(((raw < lower) | (raw > upper)).float(), mask)
    return m


def rollout_rejection_mask(
    log_ratio: Tensor,
    response_mask: Tensor,
    rollout_rs: str,
    rollout_rs_threshold: str | float | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The response mask with tokens (``token_*``) or whole sequences (``seq_*``) rejected where a divergence
    estimate of π from π_rollout leaves its bounds; ``rollout_rs`` may list several options, all must pass.

    k1 = −log w, k2 = ½(log w)², k3 = w − 1 − log w per token (log w clamped to ±20); ``seq_sum``/``seq_mean``/
    ``seq_max`` reduce them over the sequence. A k1 statistic must lie in [log lower, log upper], the others
    at most upper. Returns (mask, ``rollout_rs_*`` metrics).
    """
    options = list(dict.fromkeys(opt.strip() for opt in rollout_rs.split(",") if opt.strip()))
    unknown = [opt for opt in options if opt not in RS_OPTIONS]
    if not options or unknown:
        raise ValueError(f"rollout_rs={rollout_rs!r}: options must be among {list(RS_OPTIONS)}")
    thresholds = parse_rs_thresholds(options, rollout_rs_threshold)
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    per_token = {"k1": -safe, "k2": 0.5 * safe.square(), "k3": torch.exp(safe) - 1.0 - safe}
    valid, seq_valid = response_mask.bool(), response_mask.sum(-1) > 0
    keep_all = torch.ones_like(log_ratio)
    metrics: dict[str, Tensor] = {}
    for option in options:
        lower, upper = thresholds[option]
        kind, estimator = option.rsplit("_", 1)
        token_stat = per_token[estimator]
        seq_stat = None
        if kind == "seq_sum":
            seq_stat = masked_sum(token_stat, response_mask, dim=-1)
        elif kind == "seq_mean":
            seq_stat = masked_mean(token_stat, response_mask, dim=-1)
        elif kind == "seq_max":
            seq_stat = token_stat.masked_fill(~valid, float("-inf")).max(dim=-1).values
            seq_stat = torch.where(seq_stat == float("-inf"), 0.0, seq_stat)  # a row without tokens
        stat = token_stat if seq_stat is None else seq_stat.unsqueeze(-1).expand_as(log_ratio)
        high, low = (math.log(upper), math.log(lower)) if lower is not None else (upper, 0.0)
        keep = (stat <= high) & ((stat >= low) if lower is not None else True)
        keep_all = keep_all * keep.to(log_ratio.dtype)
        metrics.update(_rs_metrics(option, stat, response_mask, seq_valid, seq_stat, high, low, lower is not None))
        seq_keep = ~(~keep & valid).any(dim=-1)
        metrics[f"rollout_rs_{option}_masked_fraction"] = masked_mean(1.0 - keep.float(), response_mask)
        metrics[f"rollout_rs_{option}_seq_masked_fraction"] = (
            ((~seq_keep).float() * seq_valid).sum() / seq_valid.sum().clamp_min(1)  # 0 without a valid sequence
        )
    metrics["rollout_rs_masked_fraction"] = masked_mean(1.0 - keep_all, response_mask)
    metrics["rollout_rs_seq_masked_fraction"] = ((keep_all <= 0.5) & valid).any(dim=-1).float().mean()
    return (response_mask * keep_all).to(response_mask.dtype), metrics


def _rs_metrics(
    option: str,
    stat: Tensor,
    mask: Tensor,
    seq_valid: Tensor,
    seq_stat: Tensor | None,
    high: float,
    low: float,
    two_sided: bool,
) -> dict[str, Tensor]:
    """The ``rollout_rs_<option>_*`` diagnostics of one rejection statistic (per token, or per sequence)."""
    _require_valid(mask)
    p, zero = f"rollout_rs_{option}", stat.new_zeros(())
    # the sequences with a valid token, picked on the host: a boolean mask's selection has a data-dependent shape
    rows = host_read("rollout_correction.valid_sequences", seq_valid, meta_value=[True] * len(seq_valid))
    seq = (masked_mean(stat, mask, dim=-1) if seq_stat is None else seq_stat)[torch.tensor(rows, dtype=torch.bool)]
    by_sequence = seq_stat is not None and seq.numel() > 0
    m = {f"{p}_mean": masked_mean(stat, mask)}
    if by_sequence:
        m.update(
            {
                f"{p}_max": seq.max(),
                f"{p}_min": seq.min(),
                f"{p}_fraction_high": (seq > high).float().mean(),
                f"{p}_fraction_low": (seq < low).float().mean() if two_sided else zero,
            }
        )
    else:
        m.update(
            {
                f"{p}_max": _masked_extreme(stat, mask, True),
                f"{p}_min": _masked_extreme(stat, mask, False),
                f"{p}_fraction_high": masked_mean((stat > high).float(), mask),
                f"{p}_fraction_low": masked_mean((stat < low).float(), mask) if two_sided else zero,
            }
        )
    m[f"{p}_std"] = _clamped_std(stat, mask, low if two_sided else 0.0, high)
    m.update(_rs_seq_metrics(p, seq, high, low, two_sided, zero))
    return m


def _rs_seq_metrics(p: str, seq: Tensor, high: float, low: float, two_sided: bool, zero: Tensor) -> dict[str, Tensor]:
    """The ``<p>_seq_*`` diagnostics over the valid sequences' statistics ``seq``; ``zero`` for each where none is."""
    if not seq.numel():
        keys = ("mean", "std", "max", "min", "max_deviation", "fraction_high", "fraction_low")
        return {f"{p}_seq_{k}": zero for k in keys}
    m = {
        f"{p}_seq_mean": seq.mean(),
        f"{p}_seq_std": seq.std() if seq.numel() > 1 else zero,
        f"{p}_seq_max": seq.max(),
        f"{p}_seq_min": seq.min(),
        f"{p}_seq_max_deviation": seq.abs().max(),
        f"{p}_seq_fraction_high": (seq > high).float().mean(),
    }
    if two_sided:
        m[f"{p}_seq_fraction_low"] = (seq < low).float().mean()
    return m


def offpolicy_metrics(log_prob: Tensor, rollout_log_prob: Tensor, response_mask: Tensor) -> dict[str, Tensor]:
    """The gap between π and π_rollout: KL (k1, k3), perplexities and their log-difference, χ² per token and
    per sequence."""
    mean_lp = masked_mean(log_prob, response_mask, dim=-1)
    mean_rollout = masked_mean(rollout_log_prob, response_mask, dim=-1)
    log_ratio = log_prob - rollout_log_prob
    log_ppl_diff = mean_rollout - mean_lp
    seq_log_ratio = masked_sum(log_ratio, response_mask, dim=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {
        "training_ppl": torch.exp(-mean_lp).mean(),
        "training_log_ppl": (-mean_lp).mean(),
        "kl": masked_mean(rollout_log_prob - log_prob, response_mask),
        "k3_kl": masked_mean(torch.exp(log_ratio) - log_ratio - 1, response_mask),
        "rollout_ppl": torch.exp(-mean_rollout).mean(),
        "rollout_log_ppl": (-mean_rollout).mean(),
        "log_ppl_diff": log_ppl_diff.mean(),
        "log_ppl_abs_diff": log_ppl_diff.abs().mean(),
        "log_ppl_diff_max": log_ppl_diff.max(),
        "log_ppl_diff_min": log_ppl_diff.min(),
        "ppl_ratio": torch.exp(log_ppl_diff).mean(),
        "chi2_token": masked_mean(torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)).square(), response_mask) - 1,
        "chi2_seq": torch.exp(2.0 * seq_log_ratio).mean() - 1.0,
    }


def compute_policy_loss_bypass_mode(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_type: str = "ppo_clip",
    rollout_is: str | None = None,
    rollout_is_threshold: str | float = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: str | float | None = None,
) -> PolicyLossTerms:
    """Bypass mode: ``old_log_prob`` is π_rollout's (the rollout engine's log-probs); no π_old forward exists.

    Rejection (``rollout_rs``) drops tokens or sequences from the mask; then ``ppo_clip``: dual-clip PPO with
    ρ = π/π_rollout (the clip already bounds the importance weight, so w is only reported), or ``reinforce``:
    L = −A·log π·w with the truncated importance weights w (``rollout_is``; none when null).
    """
    _require_valid(response_mask)
    with torch.no_grad():
        log_ratio = log_prob - old_log_prob
        weights, metrics = (
            (None, {})
            if rollout_is is None or rollout_is_threshold is None
            else rollout_is_weights(
                log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
            )
        )
        mask = response_mask.clone()
        if rollout_rs is not None:
            if rollout_rs_threshold is None:
                raise ValueError("rollout_rs_threshold must be set when rollout_rs is")
            mask, rs_metrics = rollout_rejection_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold)
            metrics.update(rs_metrics)
        metrics.update(offpolicy_metrics(log_prob, old_log_prob, response_mask))
    if loss_type == "ppo_clip":
        terms = compute_policy_loss_vanilla(
            old_log_prob, log_prob, advantages, mask, clip_ratio_low, clip_ratio_high, clip_ratio_c
        )
        losses, loss_metrics = terms.losses, terms.metrics
    elif loss_type == "reinforce":
        losses = -advantages * log_prob * (1.0 if weights is None else weights)
        loss_metrics = {"actor/ppo_kl": masked_mean(-(log_prob - old_log_prob).detach(), mask)}
    else:
        raise ValueError(f"rollout_correction.loss_type={loss_type!r}: must be one of ppo_clip, reinforce")
    corr = {f"rollout_corr/{name}": value.detach() for name, value in metrics.items()}
    return PolicyLossTerms(losses, {**loss_metrics, **corr}, mask)
