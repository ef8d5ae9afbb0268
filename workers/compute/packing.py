"""Micro-batches by token budget (dynamic batch size), exact gradient accumulation, and padding-free forwards.

Shared by the actor (log-probs, update), the reference policy and the critic (values, update):

- **Dynamic batching.** A (mini-)batch is split into micro-batches whose valid tokens (``attention_mask``
  sum) fit ``max_token_len`` instead of a fixed number of rows, so short sequences share a forward pass.
  FSDP runs collectives in every forward, so every rank runs the same number of micro-batches.
- **Exact accumulation.** Each micro-batch loss is weighted by its share of the mini-batch (over all ranks),
  so the summed (and FSDP rank-averaged) gradient equals the gradient of the whole mini-batch's loss,
  however the rows were split into micro-batches and ranks.
- **Remove-padding.** A micro-batch's valid tokens are packed into rows with position ids that restart at 0
  per sequence: one row (1, T) under flash-attention, else rows holding whole sequences, as wide as costs least
  (``pack_width``). transformers (>= 4.53) reads the restarts from ``position_ids`` when ``attention_mask`` is
  None: flash-attention runs varlen, sdpa/eager get a block-diagonal causal mask per row
  (``masking_utils.find_packed_sequence_indices``), so no token attends across sequences. The padded path's
  ``position_ids`` must be ``cumsum(attention_mask) - 1`` on valid tokens (left-padded prompt, right-padded
  response, as the rollout writes them) for the two paths to agree.
- **Shared prompts** (``actor.use_prefix_grouper``). The rows of a micro-batch that repeat a prompt (a GRPO group)
  pack as one unit: the prompt once, then each response at the positions it has in its own row, with an explicit
  (W, W) mask per row that lets each response see the prompt and itself (``PromptUnits``). Every output equals the
  unshared one; the prompt's tokens run once instead of n times, and its gradient sums over the n responses.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
import torch.distributed as dist
from torch import Tensor, nn
from transformers import StaticCache
from transformers.cache_utils import StaticLayer


def lpt_partition(lengths: Sequence[int], num_bins: int) -> list[list[int]]:
    """Longest-first greedy: each index, longest sequence first, joins the bin with the fewest tokens.

    Ties go to the bin with fewer sequences, so with ``num_bins <= len(lengths)`` no bin stays empty.
    """
    heap = [(0, 0, b) for b in range(num_bins)]  # (tokens, sequences, bin)
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        tokens, count, b = heapq.heappop(heap)
        bins[b].append(i)
        heapq.heappush(heap, (tokens + lengths[i], count + 1, b))
    return bins


def partition_by_tokens(lengths: Sequence[int], max_tokens: int, min_bins: int = 1) -> list[list[int]]:
    """Row indices in the fewest bins (at least ``min_bins``, at most one per row) with Σ length ≤ max_tokens.

    A row longer than ``max_tokens`` gets a bin of its own. Each bin lists its rows in ascending order and the
    bins are sorted by their first row, so a budget that holds everything gives back the original order.
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    n = len(lengths)
    k = min(n, max(min_bins, math.ceil(sum(lengths) / max_tokens)))
    while True:
        bins = lpt_partition(lengths, k)
        fits = all(len(b) == 1 or sum(lengths[i] for i in b) <= max_tokens for b in bins)
        if fits or k >= n:
            return sorted(sorted(b) for b in bins)
        k += 1


def _max_over_ranks(value: int, device: torch.device) -> int:
    tensor = torch.tensor([value], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def micro_batch_indices(
    attention_mask: Tensor,
    micro_batch_size: int,
    max_token_len: int | None = None,
    sync_device: torch.device | None = None,
) -> list[Tensor]:
    """Row indices of each micro-batch: fixed ``micro_batch_size`` rows, or by token budget ``max_token_len``.

    With a budget and ``sync_device`` (an FSDP module's device), the ranks agree on one number of micro-batches
    (the largest any rank needs); every rank must hold the same number of rows, as DP dispatch guarantees.
    """
    n = attention_mask.shape[0]
    if max_token_len is None:
        if micro_batch_size <= 0:
            raise ValueError(f"micro-batch size must be positive, got {micro_batch_size}")
        return [torch.arange(i, min(i + micro_batch_size, n)) for i in range(0, n, micro_batch_size)]
    lengths = attention_mask.sum(-1).tolist()
    bins = partition_by_tokens(lengths, max_token_len)
    if sync_device is not None and dist.is_initialized() and dist.get_world_size() > 1:
        k = 1
        while (k_all := _max_over_ranks(len(bins), sync_device)) != k:  # each round raises k; k <= n ends it
            k = k_all
            bins = partition_by_tokens(lengths, max_token_len, min_bins=k)
    return [torch.tensor(b, dtype=torch.long) for b in bins]


def restore_order(chunks: list[Tensor], indices: list[Tensor]) -> Tensor:
    """Concatenate per-micro-batch outputs (rows in ``indices`` order) back into the original row order."""
    out = torch.cat(chunks)
    return out[torch.argsort(torch.cat(indices))]


@dataclass(frozen=True)
class BatchTotals:
    """A mini-batch's size summed over the data-parallel ranks that share one optimizer step."""

    tokens: float  # valid response tokens
    rows: float
    ranks: int  # FSDP averages the ranks' gradients, so each rank's loss counts 1/ranks

    def global_batch(self) -> dict[str, float]:
        """``algos.agg_loss``'s keywords that make a micro-batch's loss its share of this mini-batch's loss."""
        return {"dp_size": self.ranks, "batch_num_tokens": max(self.tokens, 1.0), "global_batch_size": self.rows}


def mini_batch_totals(response_mask: Tensor, sync_device: torch.device | None = None) -> BatchTotals:
    """Tokens and rows of this rank's (rows, R) mini-batch, summed over all ranks when ``sync_device`` is set."""
    local = torch.tensor([float(response_mask.sum()), float(response_mask.shape[0])], dtype=torch.float64)
    if sync_device is None or not dist.is_initialized() or dist.get_world_size() == 1:
        return BatchTotals(float(local[0]), float(local[1]), 1)
    total = local.to(sync_device)
    dist.all_reduce(total)
    return BatchTotals(float(total[0]), float(total[1]), dist.get_world_size())


@dataclass
class PackedBatch:
    """The valid tokens of a padded (B, L) batch in K rows of W tokens, and where the response tokens sit in them.

    Sequences never straddle rows. A row's unused tail holds pad tokens (position = column): they come after
    every valid token of the row, so causal attention keeps them out of its view, and nothing reads their outputs.
    """

    input_ids: Tensor  # (K, W): whole sequences, one after another
    position_ids: Tensor  # (K, W): 0, 1, ... within each sequence
    predictors: Tensor  # (N,): flat index into (K, W) of the token just before each valid response token
    labels: Tensor  # (N,): those response tokens
    rows: Tensor  # (N,): their row in (B, R)
    cols: Tensor  # (N,): their column in (B, R)
    shape: tuple[int, int]  # (B, R)
    keep_columns: Tensor  # (C,): the columns of (K, W) that hold a predictor (``logits_to_keep``)
    kept_index: Tensor  # (N,): each predictor's flat index into (K, C)
    # (K, 1, W, W) True = attend, where rows share a prompt (``PromptUnits``); None: transformers derives the
    # block-diagonal causal mask from the position restarts
    attention_mask: Tensor | None = None

    def to(self, device: torch.device) -> PackedBatch:
        """The same plan with its tensors on ``device`` (planned on the host, run on the device)."""
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return PackedBatch(**{k: v.to(device) if isinstance(v, Tensor) else v for k, v in moved.items()})

    def gather(self, values: Tensor) -> Tensor:
        """Per-position outputs (K, C, ...) at ``keep_columns`` -> (N, ...) at the predictors, in (B, R) order."""
        return values.flatten(0, 1)[self.kept_index]

    def unpack(self, values: Tensor) -> Tensor:
        """Per-response-token values (N, ...) -> (B, R, ...), zero where there is no valid response token."""
        out = values.new_zeros((*self.shape, *values.shape[1:]))
        return out.index_put((self.rows, self.cols), values)


def best_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices in bins of at most ``capacity`` (each length must fit): longest first, each into the fullest
    bin that still has room, else a new bin. Uses at most 11/9 of the fewest bins possible (+1).

    One pass that fills bins up, for packing rows; ``partition_by_tokens`` instead balances micro-batches
    (similar cost per forward, a bin count the ranks agree on) and retries with more bins until they fit.
    """
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (room left, bin), sorted
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        at = bisect.bisect_left(free, (lengths[i], -1))
        if at == len(free):
            bins.append([])
            room, b = capacity, len(bins) - 1
        else:
            room, b = free.pop(at)
        bins[b].append(i)
        bisect.insort(free, (room - lengths[i], b))
    return bins


@dataclass(frozen=True)
class PromptUnits:
    """Which sequences of a (B, L) batch run as one unit: each alone, or (``share_prompts``) the rows that repeat a
    prompt as that prompt once followed by each row's response (the n samples of a GRPO group)."""

    unit: Tensor  # (B,): each sequence's unit
    offset: Tensor  # (B,): how many response tokens of its unit's earlier members precede its response
    lengths: list[int]  # (U,): each unit's tokens: its prompt's once, and every member's response
    shared: bool  # some unit has more than one member

    @classmethod
    def of(cls, input_ids: Tensor, attention_mask: Tensor, response_length: int, share_prompts: bool) -> PromptUnits:
        """The units of a (B, L) batch whose last ``response_length`` columns are the responses."""
        valid = attention_mask.bool()
        prompt_length = valid.shape[1] - response_length
        batch = len(valid)
        if not share_prompts:
            zeros = torch.zeros(batch, dtype=torch.long, device=valid.device)
            return cls(torch.arange(batch, device=valid.device), zeros, valid.sum(-1).tolist(), False)
        prompts = torch.where(valid[:, :prompt_length], input_ids[:, :prompt_length], -1)  # equal iff ids and mask are
        _, unit = torch.unique(prompts, dim=0, return_inverse=True)
        response = valid[:, prompt_length:].sum(-1)
        same_earlier = (unit[:, None] == unit[None, :]).tril(-1)  # [i, j]: j < i, both in i's unit
        offset = (same_earlier * response[None, :]).sum(-1)  # no integer matmul: CUDA has none
        units = int(unit.max()) + 1 if batch else 0
        prompt = valid[:, :prompt_length].sum(-1)
        lengths = torch.zeros(units, dtype=torch.long, device=valid.device).scatter(0, unit, prompt)
        lengths = lengths.scatter_add(0, unit, response)
        return cls(unit, offset, lengths.tolist(), units < batch)


def pack_batch(
    input_ids: Tensor,
    attention_mask: Tensor,
    response_length: int,
    width: int | None = None,
    units: PromptUnits | None = None,
) -> PackedBatch:
    """Pack (B, L) left-padded-prompt + right-padded-response rows; the response is the last R columns.

    ``width=None`` puts every valid token in one row (for varlen attention kernels); a width (raised to the
    longest unit if short of it) bins whole units into rows of that many tokens (``best_fit_decreasing``), which
    keeps a dense attention mask at (W, W) per row instead of (T, T). ``units`` (default: each sequence alone)
    may join the rows of a repeated prompt (``PromptUnits``): the prompt is then packed once, each response after
    it at the positions it has in its own row, and ``attention_mask`` lets every response see the prompt and
    itself only, so each token's output is the one it has in its own row.
    """
    valid = attention_mask.bool()
    batch, length = valid.shape
    units = units or PromptUnits.of(input_ids, attention_mask, response_length, share_prompts=False)
    width, bins, first = _unit_rows(units, width)
    prompt_length = length - response_length
    first_slot = torch.tensor(first, dtype=torch.long, device=valid.device)[units.unit]
    position = valid.long().cumsum(-1) - 1  # (B, L): index among the row's valid tokens
    behind = torch.zeros_like(position)
    behind[:, prompt_length:] = units.offset[:, None]  # a response sits behind its unit's earlier responses
    slot = torch.where(valid, first_slot[:, None] + position + behind, -1)  # (B, L) flat index into (K, W)
    destination = slot[valid]
    packed_ids = input_ids.new_zeros(len(bins) * width)
    packed_ids[destination] = input_ids[valid]  # a shared prompt's rows write the same ids to the same slots
    packed_positions = torch.arange(width, device=valid.device).repeat(len(bins))
    packed_positions[destination] = position[valid]
    predictors = slot[:, prompt_length - 1 : length - 1]  # position t predicts token t + 1
    keep = (predictors >= 0) & valid[:, prompt_length:]
    rows, cols = keep.nonzero(as_tuple=True)
    predictors = predictors[keep]
    column = predictors % width
    keep_columns = torch.unique(column)  # sorted
    rank = torch.zeros(width, dtype=torch.long, device=valid.device)
    rank[keep_columns] = torch.arange(len(keep_columns), device=valid.device)
    return PackedBatch(
        input_ids=packed_ids.view(len(bins), width),
        position_ids=packed_positions.view(len(bins), width),
        predictors=predictors,
        labels=input_ids[:, prompt_length:][keep],
        rows=rows,
        cols=cols,
        shape=(batch, response_length),
        keep_columns=keep_columns,
        kept_index=predictors // width * len(keep_columns) + rank[column],
        attention_mask=_shared_prompt_mask(slot, units.unit, prompt_length, len(bins), width) if units.shared else None,
    )


def _unit_rows(units: PromptUnits, width: int | None) -> tuple[int, list[list[int]], list[int]]:
    """(the rows' width, the units in each row, each unit's first slot in (K·W)): every unit in one row with
    ``width=None``, else in rows of ``width`` tokens (raised to the longest unit), best-fit decreasing."""
    if width is None:
        if units.shared:
            raise ValueError("shared prompts need rows of a width (a dense mask per row), not one varlen row")
        width, bins = max(sum(units.lengths), 1), [list(range(len(units.lengths)))]
    else:
        width = max(width, *units.lengths)
        bins = best_fit_decreasing(units.lengths, width)
    first = [0] * len(units.lengths)
    for b, members in enumerate(bins):
        offset = b * width
        for u in members:
            first[u], offset = offset, offset + units.lengths[u]
    return width, bins, first


def _shared_prompt_mask(slot: Tensor, unit: Tensor, prompt_length: int, rows: int, width: int) -> Tensor:
    """(K, 1, W, W) True = attend: causal within a unit, a response's tokens see its prompt and themselves only.
    An unused slot sees itself only (no row of the mask is empty)."""
    valid = slot >= 0
    owner = -1 - torch.arange(rows * width, device=slot.device)
    owner[slot[valid]] = unit[:, None].expand_as(slot)[valid]
    member = torch.full((rows * width,), -1, dtype=torch.long, device=slot.device)  # -1: a prompt token
    responses = valid.clone()
    responses[:, :prompt_length] = False
    member[slot[responses]] = torch.arange(len(slot), device=slot.device)[:, None].expand_as(slot)[responses]
    return block_causal_mask(owner.view(rows, width), member.view(rows, width))


def block_causal_mask(owner: Tensor, member: Tensor | None = None) -> Tensor:
    """(K, 1, W, W) True = attend, for rows (K, W) of slots: causal among the slots of one ``owner`` (a sequence or a
    unit; an unused slot needs an owner of its own), and with ``member`` (-1 on a shared prompt's slots) a
    response's slots see the prompt's and their own only."""
    width = owner.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=owner.device).tril()
    mask = (owner[:, :, None] == owner[:, None, :]) & causal
    if member is not None:
        mask &= (member[:, None, :] == -1) | (member[:, None, :] == member[:, :, None])
    return mask[:, None]


ROW_WIDTH_MULTIPLES = (1, 2, 4, 8)  # the row widths pack_width weighs, in padded lengths


def pack_width(module: nn.Module, attention_mask: Tensor, lengths: Sequence[int] | None = None) -> int | None:
    """Row width for ``pack_batch``: one row (None) under flash-attention, whose varlen kernel costs what the
    tokens cost. sdpa / eager attention build a dense (W, W) mask per row, so a row costs W tokens of matmul
    work plus W² token pairs of attention: of 1, 2, 4 and 8 times the padded length (at least the longest of
    ``lengths``, what is packed: the sequences' valid tokens by default, or ``PromptUnits.lengths``), the width
    whose rows cost least, cost(W) = rows(W) · W · (1 + W / w0), w0 from ``_attention_break_even``. Wider rows
    pay off when sequences are short against the padded length (two 11-token sequences never share a 16-wide row).
    """
    if varlen_attention(module):
        return None
    lengths = attention_mask.sum(-1).tolist() if lengths is None else list(lengths)
    widths = [max(attention_mask.shape[1] * k, *lengths) for k in ROW_WIDTH_MULTIPLES]
    break_even = _attention_break_even(module)
    if break_even is None:
        return widths[0]

    def cost(width: int) -> float:
        return len(best_fit_decreasing(lengths, width)) * width * (1 + width / break_even)

    return min(widths, key=cost)


def pack_for(
    module: nn.Module, input_ids: Tensor, attention_mask: Tensor, response_length: int, share_prompts: bool = False
) -> PackedBatch:
    """``pack_batch`` in rows of ``pack_width``'s width for ``module``; with ``share_prompts`` the rows that repeat
    a prompt share it (``PromptUnits``), except under flash-attention, whose varlen row takes no mask."""
    units = PromptUnits.of(input_ids, attention_mask, response_length, share_prompts and takes_dense_mask(module))
    return pack_batch(
        input_ids, attention_mask, response_length, pack_width(module, attention_mask, units.lengths), units
    )


def varlen_attention(module: nn.Module) -> bool:
    """Whether ``module`` attends with flash-attention's varlen kernel (packed rows need no mask, take none)."""
    implementation = getattr(getattr(module, "config", None), "_attn_implementation", None) or ""
    return implementation.startswith("flash")


def takes_dense_mask(module: nn.Module) -> bool:
    """Whether every layer of ``module`` applies a given (K, 1, W, W) mask as it is: sdpa or eager attention, and
    full attention in every layer (a sliding-window layer would need a mask of its own)."""
    config = getattr(module, "config", None)
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager"):
        return False
    return all(type(layer) is StaticLayer for layer in StaticCache(config=config, max_cache_len=1).layers)


def _attention_break_even(module: nn.Module) -> float | None:
    """The row width at which a transformer block spends as much on attention as on its matmuls, per token.

    Per token a block's matmuls take 2·params FLOPs and its attention 4·hidden per key in the row (QKᵀ and
    AV), so w0 = params / (2·hidden). None for a model without ``config.hidden_size`` or named blocks
    (``_no_split_modules``).
    """
    hidden = getattr(getattr(module, "config", None), "hidden_size", None)
    names = set(getattr(module, "_no_split_modules", None) or ())
    block = next((m for m in module.modules() if type(m).__name__ in names), None)
    if not hidden or block is None:
        return None
    return sum(p.numel() for p in block.parameters()) / (2 * hidden)


def model_attention_mask(module: nn.Module, mask: Tensor | None) -> Tensor | None:
    """A (K, 1, W, W) boolean mask (True = attend) as ``module``'s attention takes a 4-D mask: sdpa as is, eager
    attention as an additive one (0 or the dtype's lowest), since it adds its mask to the scores."""
    implementation = getattr(getattr(module, "config", None), "_attn_implementation", None)
    if mask is None or implementation != "eager":
        return mask
    return torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, torch.finfo().min)
