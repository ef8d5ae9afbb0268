"""``trainer.balance_batch``: reorder a step's rows so that every worker gets a similar number of tokens.

After generation the responses have different lengths; the workers split the batch into equal consecutive shares
(the same number of rows each), so one worker may get the long ones and the others wait for it in every later
phase. The driver reorders the rows (tensors and per-row columns) so that each consecutive share holds about the
same number of tokens (``trainer.balance_batch``). Advantages are computed per prompt group (uid),
so the order does not change them; the mini-batches of the update are drawn from the new order.

With ``actor.use_prefix_grouper`` a prompt's rows must stay together (they share the prompt's forward), so whole
groups are placed instead of rows (``planner.plan`` checks that the groups divide evenly over the workers).
"""

from __future__ import annotations

import heapq

import numpy as np
import torch

from single_controller.data_proto import DataProto


def balanced_partitions(workloads: list[int], parts: int) -> list[list[int]]:
    """``parts`` lists of item indices, each of ``len(workloads) / parts`` items (which must divide), whose workload
    sums are close: the items, heaviest first, each go to the lightest part that still has room (LPT with equal
    sizes). Each list is in increasing index order."""
    size, remainder = divmod(len(workloads), parts)
    if remainder:
        raise ValueError(f"{len(workloads)} items do not split into {parts} equal parts")
    heap = [(0, part) for part in range(parts)]  # (load, part): the lightest part with room on top
    members: list[list[int]] = [[] for _ in range(parts)]
    for item in sorted(range(len(workloads)), key=lambda i: (-workloads[i], i)):
        load, part = heapq.heappop(heap)
        members[part].append(item)
        if len(members[part]) < size:
            heapq.heappush(heap, (load + workloads[item], part))
    return [sorted(m) for m in members]


def balance_batch(
    batch: DataProto, n_workers: int, keep_groups: bool, extras: dict[str, list] | None = None
) -> dict[str, float]:
    """Reorder ``batch`` in place so each of the ``n_workers`` consecutive shares holds about the same number of
    tokens (``attention_mask`` sums), and the per-row lists of ``extras`` with it (the reward function's values,
    when the reward ran first); ``keep_groups``: a prompt's rows (one ``uid``) move together. Returns the
    ``global_seqlen/*`` metrics: the token sums of the shares before (min, max, minmax_diff) and after
    (balanced_min, balanced_max), and their mean."""
    lengths = batch.batch["attention_mask"].sum(-1).tolist()
    if keep_groups:
        uids = list(batch.non_tensor_batch["uid"])
        groups = list(dict.fromkeys(uids))  # in order of first appearance
        rows_of = {uid: [i for i, u in enumerate(uids) if u == uid] for uid in groups}
        placed = balanced_partitions([sum(lengths[i] for i in rows_of[uid]) for uid in groups], n_workers)
        shares = [[i for g in part for i in rows_of[groups[g]]] for part in placed]
    else:
        shares = balanced_partitions(lengths, n_workers)
    order = [i for share in shares for i in share]
    reordered = batch[torch.tensor(order)]
    batch.batch, batch.non_tensor_batch = reordered.batch, reordered.non_tensor_batch
    for key, values in (extras or {}).items():
        extras[key] = [values[i] for i in order]
    before = np.asarray(lengths).reshape(n_workers, -1).sum(-1)
    after = [sum(lengths[i] for i in share) for share in shares]
    return {
        "global_seqlen/min": float(before.min()),
        "global_seqlen/max": float(before.max()),
        "global_seqlen/minmax_diff": float(before.max() - before.min()),
        "global_seqlen/balanced_min": float(min(after)),
        "global_seqlen/balanced_max": float(max(after)),
        "global_seqlen/mean": float(before.mean()),
    }
