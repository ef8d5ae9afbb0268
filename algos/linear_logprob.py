"""Per-token log-probs, entropies and the exact KL from hidden states: a fused LM head that holds the logits of
one chunk of tokens at a time, never the whole (N, V) matrix, and recomputes them in backward.

For N positions with final hidden states h (N, H), an LM head W (V, H) (+ bias b), the tokens y (N,) (and, for
top-k distillation, K more token ids per position, the teacher's top-k) and the sampling temperature τ, per chunk
of rows:

    z = (h·Wᵀ + b) / τ                      fp32 logits (the matmul runs in the head's dtype, as the model's does)
    lse = logsumexp(z);   log π(y) = z_y − lse   (and log π(v) = z_v − lse at each other id v)
    H = −Σ_v p_v·log p_v,   log p = z − lse,   p = exp(log p)            (the entropy reuses the logsumexp)
    KL(π ‖ π_ref) = Σ_v p_v·(log p_v − log q_v),   log q = z' − lse'      (z', lse': the reference's; exact)
    Σπ² = Σ_v p_v²                                                    (no gradient: the optimal token baseline's)

A frozen teacher's scores (``linear_scores``, no gradient) come from the same chunks: log ν(y) and, for top-k
distillation, the K largest log ν(v) per position and their ids.

Backward recomputes z chunk by chunk from what the forward kept (h, W, lse, H, KL); when all N rows fit one
chunk (a micro-batch of a few responses), the forward keeps that chunk's log p instead, and backward skips the
recomputation:

    ∂log π(y)/∂z = onehot(y) − p (each id's, weighted by its grad);   ∂H/∂z = −p·(log p + H)
    ∂KL/∂z = p·(log p − log q − KL)
    ∂/∂h = (g/τ)·W,   ∂/∂W = (g/τ)ᵀ·h,   ∂/∂b = Σ_rows g/τ   (g: the three terms weighted by the outputs' grads)

The reference side is a constant (no gradient), as in ``algos.kl.kl_full``. The chunk holds ``CHUNK_ELEMENTS``
logits, so a forward or backward keeps a few (chunk, V) fp32 tensors alive whatever N and V are (one of them
from forward to backward when N fits a chunk).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

CHUNK_ELEMENTS = 2**24  # logits per chunk: 64 MiB of fp32, about 340 tokens of a 49k vocabulary


def chunk_rows(vocab_size: int) -> int:
    """Rows per chunk for a vocabulary of ``vocab_size``."""
    return max(1, CHUNK_ELEMENTS // vocab_size)


def head_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float) -> Tensor:
    """fp32 logits / τ (N, V) of hidden states (N, H); no copy beyond the matmul's output at τ = 1 in fp32."""
    logits = F.linear(hidden, weight, bias).float()
    return logits if temperature == 1.0 else logits / temperature


def _rowdot(a: Tensor, b: Tensor) -> Tensor:
    """Σ_v a·b per row: (n, V), (n, V) -> (n,)."""
    return torch.einsum("nv,nv->n", a, b)


class _LinearLogProbs(torch.autograd.Function):
    """Autograd of ``linear_log_probs``; outputs (log π(y), H, KL or an empty tensor, Σπ²)."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        labels: Tensor,  # (N, J): the sampled token, then any other ids
        ref_hidden: Tensor | None,
        ref_weight: Tensor | None,
        ref_bias: Tensor | None,
        temperature: float,
        rows: int,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        n = hidden.shape[0]
        log_probs = hidden.new_empty(labels.shape, dtype=torch.float32)
        entropy = hidden.new_empty(n, dtype=torch.float32)
        lse, sum_p2 = torch.empty_like(entropy), torch.empty_like(entropy)
        with_ref = ref_hidden is not None
        kl, ref_lse = (torch.empty_like(entropy), torch.empty_like(entropy)) if with_ref else (None, None)
        # all rows in one chunk: keep its log p for backward instead of recomputing the logits there
        keep = 0 < n <= rows and any(ctx.needs_input_grad[:3])
        for start in range(0, n, rows):
            part = slice(start, start + rows)
            z = head_logits(hidden[part], weight, bias, temperature)
            lse[part] = torch.logsumexp(z, dim=-1)
            log_probs[part] = z.gather(-1, labels[part]) - lse[part, None]
            log_p = z.sub_(lse[part, None])  # in place of z
            p = torch.exp(log_p)
            entropy[part] = -_rowdot(p, log_p)
            sum_p2[part] = _rowdot(p, p)
            if with_ref:
                log_q = head_logits(ref_hidden[part], ref_weight, ref_bias, temperature)
                ref_lse[part] = torch.logsumexp(log_q, dim=-1)
                # term by term, so identical policies give exactly 0
                kl[part] = _rowdot(p, log_p - log_q.sub_(ref_lse[part, None]))
        ctx.save_for_backward(
            hidden,
            weight,
            bias,
            labels,
            lse,
            entropy,
            ref_hidden,
            ref_weight,
            ref_bias,
            ref_lse,
            kl,
            log_p if keep else None,
        )
        ctx.temperature, ctx.rows = temperature, rows
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(sum_p2)
        return log_probs, entropy, kl if with_ref else entropy.new_empty(0), sum_p2

    @staticmethod
    def backward(
        ctx: Any, grad_log_probs: Tensor | None, grad_entropy: Tensor | None, grad_kl: Tensor | None, _grad_sum_p2: None
    ):
        (hidden, weight, bias, labels, lse, entropy, ref_hidden, ref_weight, ref_bias, ref_lse, kl, log_p) = (
            ctx.saved_tensors
        )
        want_hidden, want_weight, want_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros_like(hidden) if want_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if want_weight else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if want_bias else None
        if ref_hidden is None:
            grad_kl = None
        for start in range(0, hidden.shape[0], ctx.rows):
            part = slice(start, start + ctx.rows)
            g = _logit_grad(
                ctx,
                part,
                hidden,
                weight,
                bias,
                labels,
                lse,
                entropy,
                grad_log_probs,
                grad_entropy,
                (grad_kl, ref_hidden, ref_weight, ref_bias, ref_lse, kl),
                log_p,
            )
            if g is None:
                continue
            g = g.to(weight.dtype)
            if want_hidden:
                grad_hidden[part] = g @ weight
            if want_weight:
                grad_weight += (g.t() @ hidden[part]).float()
            if want_bias:
                grad_bias += g.float().sum(0)
        to_dtype = lambda grad, like: None if grad is None else grad.to(like.dtype)  # noqa: E731
        return grad_hidden, to_dtype(grad_weight, weight), to_dtype(grad_bias, bias), None, None, None, None, None, None


def _logit_grad(
    ctx: Any,
    part: slice,
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    labels: Tensor,
    lse: Tensor,
    entropy: Tensor,
    grad_log_probs: Tensor | None,
    grad_entropy: Tensor | None,
    ref: tuple,
    log_p: Tensor | None,
) -> Tensor | None:
    """∂loss/∂(logits before τ) of one chunk (fp32), from the outputs' gradients (``log_p``: the chunk's log p
    if the forward kept it); None when none flows."""
    grad_kl, ref_hidden, ref_weight, ref_bias, ref_lse, kl = ref
    if grad_log_probs is None and grad_entropy is None and grad_kl is None:
        return None
    if log_p is None:
        log_p = head_logits(hidden[part], weight, bias, ctx.temperature).sub_(lse[part, None])
    p = torch.exp(log_p)
    g = torch.zeros_like(p)
    if grad_log_probs is not None:  # Σ_j g_j·(onehot(id_j) − p)
        grads = grad_log_probs[part].float()
        g.addcmul_(p, grads.sum(-1, keepdim=True), value=-1.0)
        g.scatter_add_(-1, labels[part], grads)
    if grad_entropy is not None:  # −p·(log p + H)
        g.addcmul_(p * (log_p + entropy[part, None]), grad_entropy[part, None], value=-1.0)
    if grad_kl is not None:  # p·(log p − log q − KL)
        log_q = head_logits(ref_hidden[part], ref_weight, ref_bias, ctx.temperature).sub_(ref_lse[part, None])
        g.addcmul_(p * (log_p - log_q - kl[part, None]), grad_kl[part, None])
    return g if ctx.temperature == 1.0 else g.div_(ctx.temperature)


def linear_log_probs(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    ref: tuple[Tensor, Tensor, Tensor | None] | None = None,
    topk_ids: Tensor | None = None,
) -> dict[str, Tensor]:
    """``log_probs`` log π(y), ``entropy`` H, ``sum_pi_squared`` Σπ² (and with ``ref`` ``kl``, KL(π ‖ π_ref)), each
    (N,) fp32, of the head ``weight`` (V, H) (+ ``bias``) on ``hidden`` (N, H) for the tokens ``labels`` (N,) at
    ``temperature``; with ``topk_ids`` (N, K) also ``topk_log_probs`` (N, K), log π at those ids (a teacher's top-k),
    from the same chunks.

    ``ref`` = (hidden, weight, bias) of the reference policy at the same N positions; it gets no gradient.
    Differentiable in ``hidden``, ``weight`` and ``bias`` (Σπ² is not); an output whose gradient is not needed (an
    entropy only logged) costs nothing in backward.
    """
    ref_hidden, ref_weight, ref_bias = (t.detach() if t is not None else None for t in (ref or (None, None, None)))
    ids = labels[:, None] if topk_ids is None else torch.cat([labels[:, None], topk_ids.to(labels.dtype)], dim=-1)
    log_probs, entropy, kl, sum_p2 = _LinearLogProbs.apply(
        hidden, weight, bias, ids, ref_hidden, ref_weight, ref_bias, float(temperature), chunk_rows(weight.shape[0])
    )
    out = {"log_probs": log_probs[:, 0], "entropy": entropy, "sum_pi_squared": sum_p2}
    if topk_ids is not None:
        out["topk_log_probs"] = log_probs[:, 1:]
    return {**out, "kl": kl} if ref is not None else out


def logit_scores(logits: Tensor, labels: Tensor, k: int | None = None) -> dict[str, Tensor]:
    """A frozen model's scores from fp32 logits (n, V): ``log_probs`` (n,) of ``labels``, and with ``k`` the k most
    likely tokens' ``topk_ids`` (n, k) (int64) and ``topk_log_probs`` (n, k), largest first."""
    lse = torch.logsumexp(logits, dim=-1)
    out = {"log_probs": logits.gather(-1, labels[:, None]).squeeze(-1) - lse}
    if k is not None:
        values, ids = logits.topk(k, dim=-1)
        out.update(topk_ids=ids, topk_log_probs=values - lse[:, None])
    return out


@torch.no_grad()
def linear_scores(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    k: int | None = None,
) -> dict[str, Tensor]:
    """``logit_scores`` of the head ``weight`` (V, H) (+ ``bias``) on ``hidden`` (N, H) at ``temperature``, one chunk
    of rows at a time (no (N, V) logits): a teacher's log-probs of the sampled tokens, or its top-k."""
    rows = chunk_rows(weight.shape[0])
    parts = [
        logit_scores(head_logits(hidden[i : i + rows], weight, bias, temperature), labels[i : i + rows], k)
        for i in range(0, hidden.shape[0], rows)
    ]
    if not parts:  # no valid response token in the micro-batch
        return logit_scores(hidden.new_zeros(0, weight.shape[0], dtype=torch.float32), labels, k)
    return {name: torch.cat([part[name] for part in parts]) for name in parts[0]}
