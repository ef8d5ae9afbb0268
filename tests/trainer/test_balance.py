"""trainer.balance_batch: the rows are reordered so every worker's share holds a similar number of tokens; a
prompt group stays together when the prefix grouper needs it; nothing but the order changes."""

import numpy as np
import pytest
import torch

from planner import load_config, make_plan
from single_controller import DataProto
from trainer.running.balance import balance_batch, balanced_partitions


def _batch(lengths, group=1):
    width = max(lengths)
    mask = torch.tensor([[0] * (width - n) + [1] * n for n in lengths])
    uids = np.array([f"p{i // group}" for i in range(len(lengths))], dtype=object)
    return DataProto.from_dict({"attention_mask": mask, "row": torch.arange(len(lengths))}, {"uid": uids})


def test_partitions_are_equal_sized_and_balanced():
    workloads = [100, 1, 90, 2, 80, 3, 70, 4]
    parts = balanced_partitions(workloads, 2)
    assert sorted(i for p in parts for i in p) == list(range(8)) and all(len(p) == 4 for p in parts)
    sums = [sum(workloads[i] for i in p) for p in parts]
    assert max(sums) - min(sums) <= 20  # consecutive halves would be 196 against 154
    with pytest.raises(ValueError):
        balanced_partitions([1, 2, 3], 2)


def test_balance_reorders_rows_only_and_evens_the_shares():
    lengths = [30, 29, 28, 27, 3, 2, 2, 1]  # the first worker would get all the long rows
    batch = _batch(lengths)
    metrics = balance_batch(batch, 2, keep_groups=False)
    rows = batch.batch["row"].tolist()
    assert sorted(rows) == list(range(8))
    assert batch.non_tensor_batch["uid"].tolist() == [f"p{r}" for r in rows]  # columns move with their rows
    shares = batch.batch["attention_mask"].sum(-1).reshape(2, -1).sum(-1).tolist()
    assert (metrics["global_seqlen/max"], metrics["global_seqlen/min"]) == (114, 8)
    assert abs(shares[0] - shares[1]) <= 2 and metrics["global_seqlen/balanced_max"] == max(shares)


def test_prefix_grouper_keeps_a_prompts_rows_together():
    batch = _batch([9, 9, 8, 8, 1, 1, 2, 2], group=2)
    balance_batch(batch, 2, keep_groups=True)
    uids = batch.non_tensor_batch["uid"].tolist()
    for share in (uids[:4], uids[4:]):
        assert all(share.count(u) == 2 for u in share)  # whole groups, consecutive
        assert share[0] == share[1] and share[2] == share[3]


def test_plan_balances_on_several_workers_only():
    two = load_config(["trainer.balance_batch=true"])  # the demo: 2 workers
    assert make_plan(two, 2).balance_batch and "balance" in [p.name for p in make_plan(two, 2).flows["step"].phases]
    assert not make_plan(two, 1).balance_batch
    assert make_plan(two, 2).flows["step"].route("gen").keep == ()  # the rollout's rows come to the driver


def test_the_reward_values_move_with_their_rows():
    """After dynamic sampling's filter the reward has run: its per-row values are reordered with the rows."""
    batch = _batch([30, 29, 28, 27, 3, 2, 2, 1])
    extras = {"score": [float(i) for i in range(8)], "acc": list("abcdefgh")}
    balance_batch(batch, 2, keep_groups=False, extras=extras)
    rows = batch.batch["row"].tolist()
    assert extras == {"score": [float(r) for r in rows], "acc": ["abcdefgh"[r] for r in rows]}


def test_balance_runs_at_verls_place_between_generation_and_reward():
    cfg = load_config(["trainer.balance_batch=true"])
    names = [p.name for p in make_plan(cfg, 2).flows["step"].phases]
    assert names.index("gen") + 1 == names.index("balance") < names.index("reward")


def test_with_dynamic_sampling_the_rows_kept_are_balanced_by_the_filter():
    """verl's DAPO loop balances the collected batch: filter_groups (which brings every row it keeps to the driver)
    balances them, not a phase after the rollout, whose rows are not yet the step's."""
    cfg = load_config(["trainer.balance_batch=true", "algorithm.filter_groups.enable=true", "data.gen_batch_size=8"])
    plan = make_plan(cfg, 2)
    names = [p.name for p in plan.flows["step"].phases]
    assert plan.balance_batch and "balance" not in names and names.index("reward") < names.index("filter_groups")
    assert plan.flows["step"].route("gen").keep == ()  # the rollout's rows come to the driver
