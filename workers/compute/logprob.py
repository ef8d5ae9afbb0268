"""Per-token log-probs, entropies and the exact KL of a causal LM's responses, for the actor, the reference and the
old log-probs, without the full-vocabulary logits.

The model's forward runs only its decoder: its LM head is the identity inside :func:`hidden_states_out`, so the
forward returns final hidden states, and only at the positions that predict a valid response token (the padded
batch's response positions, or the packed rows' predictors with remove-padding). The head is then applied by
``algos.linear_logprob.linear_log_probs`` in chunks of tokens, with the logits recomputed in backward
(``actor_rollout_ref.model.use_fused_kernels``), or, with fused kernels off, as one matmul over those
rows. A model whose logits are not the plain output of its head (softcapping, logit scaling, a LoRA adapter on
the head) keeps its own head: the forward returns its logits at those rows.

Every matmul of the head gets a contiguous (rows, hidden) matrix. Slicing the last positions of a (B, T, H)
activation instead, as ``logits_to_keep=k`` does, hands ``F.linear`` a strided 3-D input; with a frozen head (LoRA)
``torch.matmul`` then runs ``bmm`` against the weight expanded to (B, H, V), which oneDNN's bf16 path copies B
times (docs/benchmarks.md, "Precision").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from algos import entropy_from_logits, kl_full, logprobs_from_logits, sum_pi_squared_from_logits
from algos.distillation import topk_log_probs_from_logits
from algos.linear_logprob import head_logits, linear_log_probs, linear_scores, logit_scores
from workers.compute.packing import model_attention_mask, pack_for
from workers.parallel.lora import as_reference

# per-position statistics of the policy a forward can return beside the log-probs: logits (..., V) -> (...)
STATS: dict[str, Callable[[Tensor], Tensor]] = {
    "entropy": entropy_from_logits,
    "sum_pi_squared": sum_pi_squared_from_logits,
}
# config attributes of models whose logits are a transform of the head's output (Gemma's softcapping, Cohere's
# logit_scale, Granite's logits_scaling, ...): their own head is kept
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier")


def output_head(module: nn.Module) -> nn.Linear | None:
    """The LM head when the model's logits are exactly its output (then ColoRL applies it), else None."""
    get = getattr(module, "get_output_embeddings", None)
    head = get() if get is not None else None
    if type(head) is not nn.Linear:  # none, or wrapped (e.g. a peft LoRA layer on the head)
        return None
    config = getattr(module, "config", None)
    configs = [config, getattr(config, "text_config", None)]
    if any(getattr(c, name, None) not in (None, 1, 1.0) for c in configs for name in LOGIT_TRANSFORMS):
        return None
    return head


def _identity(hidden: Tensor) -> Tensor:
    return hidden


@contextmanager
def hidden_states_out(head: nn.Linear | None) -> Iterator[None]:
    """Inside, the model's forward returns final hidden states in ``.logits`` (its LM ``head`` is the identity).

    Only ``head.forward`` is replaced (restored on exit, nesting allowed): the head's parameters stay registered, so
    FSDP gathers them with their group and ``head.weight`` is the full weight after the forward.
    """
    if head is None:
        yield
        return
    previous = head.__dict__.get("forward")
    head.forward = _identity
    try:
        yield
    finally:
        if previous is None:
            del head.forward
        else:
            head.forward = previous


@dataclass
class ResponseRows:
    """A forward's outputs at the positions that predict each valid response token, in (B, R) row-major order."""

    outputs: Tensor  # (N, D): hidden states (D = hidden) or, for a model that keeps its head, logits (D = V)
    labels: Tensor  # (N,): the response tokens they predict
    unpack: Callable[[Tensor], Tensor]  # per-token values (N, ...) -> (B, R, ...), zero where there is no valid token
    select: Callable[[Tensor], Tensor]  # per-token inputs (B, R, ...) -> (N, ...), the rows' order (unpack's inverse)


def response_rows(
    module: nn.Module, micro: dict[str, Tensor], response_length: int, remove_padding: bool, share_prompts: bool = False
) -> ResponseRows:
    """One forward of ``module`` on a micro-batch (input_ids, attention_mask, position_ids; the response is the last
    ``response_length`` columns), keeping only the positions that predict a valid response token.

    Padded: the R positions before each response token are gathered inside the model (a contiguous (B, R, ·)
    output), then the valid ones. Remove-padding: packed rows (``packing.pack_batch``), only the columns that hold
    a predictor; with ``share_prompts`` the rows that repeat a prompt run it once (``packing.PromptUnits``), in
    packed rows whether or not remove-padding is on (the prefix grouper runs without it).
    """
    input_ids, mask = micro["input_ids"], micro["attention_mask"]
    # the layout is planned on the host copies (``update.to_device``) when the micro-batch has them
    host_ids, host_mask = micro.get("host_input_ids", input_ids), micro.get("host_attention_mask", mask)
    if remove_padding or share_prompts:
        packed = pack_for(module, host_ids, host_mask, response_length, share_prompts).to(input_ids.device)
        out = module(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            use_cache=False,
            attention_mask=model_attention_mask(module, packed.attention_mask),
            logits_to_keep=packed.keep_columns,
        ).logits
        return ResponseRows(
            packed.gather(out), packed.labels, packed.unpack, lambda values: values[packed.rows, packed.cols]
        )
    batch, length = input_ids.shape
    predictors = torch.arange(length - response_length - 1, length - 1, device=input_ids.device)
    out = module(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=micro["position_ids"],
        use_cache=False,
        logits_to_keep=predictors,  # one index per column, as every transformers 5 reads it (a per-row (B, R) is 5.20+)
    ).logits  # (B, R, D), contiguous: an indexed copy
    # the valid positions as (row, column) indices: a boolean mask's selection would read its count on the host
    valid = tuple(i.to(input_ids.device) for i in host_mask[:, -response_length:].bool().nonzero(as_tuple=True))

    def unpack(values: Tensor) -> Tensor:
        return values.new_zeros((batch, response_length, *values.shape[1:])).index_put(valid, values)

    return ResponseRows(out[valid], input_ids[:, -response_length:][valid], unpack, lambda values: values[valid])


def token_stats(
    module: nn.Module,
    micro: dict[str, Tensor],
    response_length: int,
    temperature: float,
    remove_padding: bool,
    fused: bool,
    stats: tuple[str, ...] = ("entropy",),
    ref_module: nn.Module | None = None,
    entropy_grad: bool = True,
    share_prompts: bool = False,
    topk_ids: Tensor | None = None,
) -> dict[str, Tensor]:
    """``log_probs`` log π (B, R) of the temperature-scaled policy on a micro-batch, the statistics named in
    ``stats`` (``STATS``), with ``ref_module`` ``kl``: the exact KL to it, and with ``topk_ids`` (B, R, K) (a
    teacher's top-k) ``topk_log_probs`` (B, R, K): log π at those ids; zero where there is no valid response token.

    ``fused``: the chunked head of ``algos.linear_logprob``; otherwise the head's logits of the N valid rows, as one
    (N, V) matrix. ``ref_module`` runs first, without gradient, on the same rows (a LoRA actor is its own reference:
    ``lora.as_reference``). Differentiable w.r.t. ``module``'s parameters when grad is enabled; without
    ``entropy_grad`` the unfused entropy keeps no (N, V) graph (the fused one costs nothing in backward unless used).
    ``share_prompts``: the rows that repeat a prompt run it once, in packed rows (``response_rows``).
    """
    head = output_head(module)
    ref = None
    if ref_module is not None:
        ref_head = output_head(ref_module)
        with torch.no_grad(), as_reference(ref_module), hidden_states_out(ref_head):
            ref = (response_rows(ref_module, micro, response_length, remove_padding, share_prompts).outputs, ref_head)
    with hidden_states_out(head):
        rows = response_rows(module, micro, response_length, remove_padding, share_prompts)
    ids = rows.select(topk_ids) if topk_ids is not None else None
    if fused and head is not None and (ref is None or ref[1] is not None):
        ref_args = (ref[0], ref[1].weight, ref[1].bias) if ref is not None else None
        out = linear_log_probs(
            rows.outputs, head.weight, rows.labels, head.bias, temperature, ref=ref_args, topk_ids=ids
        )
        values = {"log_probs": out["log_probs"], **{k: out[k] for k in (*stats, "kl", "topk_log_probs") if k in out}}
    else:
        logits = _logits(rows.outputs, head, temperature)
        values = {"log_probs": logprobs_from_logits(logits, rows.labels)}
        if ids is not None:
            values["topk_log_probs"] = topk_log_probs_from_logits(logits, ids)
        for name in stats:  # only an entropy in the loss keeps its graph
            with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad and name == "entropy"):
                values[name] = STATS[name](logits)
        if ref is not None:
            values["kl"] = kl_full(logits, _logits(ref[0], ref[1], temperature))
    return {name: rows.unpack(value) for name, value in values.items()}


@torch.no_grad()
def teacher_scores(
    module: nn.Module,
    micro: dict[str, Tensor],
    response_length: int,
    remove_padding: bool,
    fused: bool,
    topk: int | None = None,
    temperature: float = 1.0,
    share_prompts: bool = False,
) -> dict[str, Tensor]:
    """A frozen teacher's scores of the sampled responses on a micro-batch (``token_stats``'s inputs): ``log_probs``
    (B, R) of the sampled tokens, and with ``topk`` its ``topk_ids`` (B, R, k) (int64) and ``topk_log_probs``
    (B, R, k); zero where there is no valid response token. ``fused``: the chunked head
    (``algos.linear_logprob.linear_scores``), else the head's logits of the valid rows as one matrix;
    ``share_prompts``: ``response_rows``'."""
    head = output_head(module)
    with hidden_states_out(head):
        rows = response_rows(module, micro, response_length, remove_padding, share_prompts)
    if fused and head is not None:
        out = linear_scores(rows.outputs, head.weight, rows.labels, head.bias, temperature, topk)
    else:
        out = logit_scores(_logits(rows.outputs, head, temperature), rows.labels, topk)
    return {name: rows.unpack(value) for name, value in out.items()}


def _logits(outputs: Tensor, head: nn.Linear | None, temperature: float) -> Tensor:
    """fp32 logits / τ of rows that are hidden states (``head`` given) or already logits (no copy at τ = 1, fp32)."""
    if head is not None:
        return head_logits(outputs, head.weight, head.bias, temperature)
    logits = outputs.float()
    return logits if temperature == 1.0 else logits / temperature
