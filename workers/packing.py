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
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn


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


def pack_batch(
    input_ids: Tensor, attention_mask: Tensor, response_length: int, width: int | None = None
) -> PackedBatch:
    """Pack (B, L) left-padded-prompt + right-padded-response rows; the response is the last R columns.

    ``width=None`` puts every valid token in one row (for varlen attention kernels); a width (raised to the
    longest sequence if short of it) bins whole sequences into rows of that many tokens
    (``best_fit_decreasing``), which keeps a dense attention mask at (W, W) per row instead of (T, T).
    """
    valid = attention_mask.bool()
    batch, length = valid.shape
    lengths = valid.sum(-1).tolist()
    if width is None:
        width, bins = max(sum(lengths), 1), [list(range(batch))]
    else:
        width = max(width, *lengths)
        bins = best_fit_decreasing(lengths, width)
    row_of, start = [0] * batch, [0] * batch  # each sequence's packed row and first column
    for b, members in enumerate(bins):
        offset = 0
        for i in members:
            row_of[i], start[i], offset = b, offset, offset + lengths[i]
    first_slot = torch.tensor([r * width + c for r, c in zip(row_of, start)], device=valid.device)
    position = valid.long().cumsum(-1) - 1  # (B, L): index among the row's valid tokens
    slot = torch.where(valid, first_slot[:, None] + position, -1)  # (B, L) flat index into (K, W)
    destination = slot[valid]
    packed_ids = input_ids.new_zeros(len(bins) * width)
    packed_ids[destination] = input_ids[valid]
    packed_positions = torch.arange(width, device=valid.device).repeat(len(bins))
    packed_positions[destination] = position[valid]
    prompt_length = length - response_length
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
    )


ROW_WIDTH_MULTIPLES = (1, 2, 4, 8)  # the row widths pack_width weighs, in padded lengths


def pack_width(module: nn.Module, attention_mask: Tensor) -> int | None:
    """Row width for ``pack_batch``: one row (None) under flash-attention, whose varlen kernel costs what the
    tokens cost. sdpa / eager attention build a dense (W, W) mask per row, so a row costs W tokens of matmul
    work plus W² token pairs of attention: of 1, 2, 4 and 8 times the padded length, the width whose rows cost
    least, cost(W) = rows(W) · W · (1 + W / w0), w0 from ``_attention_break_even``. Wider rows pay off when
    sequences are short against the padded length (two 11-token sequences never share a 16-wide row).
    """
    implementation = getattr(getattr(module, "config", None), "_attn_implementation", None) or ""
    if implementation.startswith("flash"):
        return None
    length = attention_mask.shape[1]
    break_even = _attention_break_even(module)
    if break_even is None:
        return length
    lengths = attention_mask.sum(-1).tolist()

    def cost(width: int) -> float:
        return len(best_fit_decreasing(lengths, width)) * width * (1 + width / break_even)

    return min((length * k for k in ROW_WIDTH_MULTIPLES), key=cost)


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
