"""Dynamic batch size and remove-padding: budgets, row order, and the same numbers as the padded path."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM

from algos import LOSS_AGG_MODES, agg_loss
from config.sections import CriticModelConfig
from tests.workers.helpers import actor_config, critic_config, free_port, init_gloo, make_update_batch
from workers.compute.actor import DataParallelPPOActor
from workers.compute.critic import DataParallelPPOCritic, load_value_model
from workers.compute.packing import (
    BatchTotals,
    best_fit_decreasing,
    micro_batch_indices,
    mini_batch_totals,
    pack_batch,
    pack_width,
    partition_by_tokens,
    restore_order,
)

P, R, ROWS = 6, 5, 8
TOL = dict(rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------- pure pieces


@pytest.mark.parametrize(
    ("lengths", "budget"), [([5, 3, 8, 2, 7, 4], 10), ([12, 3, 4, 9], 10), ([1, 1, 1], 100), ([4, 4, 4, 4], 4)]
)
def test_partition_covers_every_row_once_within_budget(lengths, budget):
    bins = partition_by_tokens(lengths, budget)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    for b in bins:
        assert b == sorted(b)
        assert len(b) == 1 or sum(lengths[i] for i in b) <= budget  # an over-long row sits alone
    assert len(bins) >= -(-sum(lengths) // budget)


def test_partition_hand_examples():
    assert partition_by_tokens([12, 3, 4], 10) == [[0], [1, 2]]
    assert partition_by_tokens([1, 1, 1], 100) == [[0, 1, 2]]  # everything fits: the original order
    assert len(partition_by_tokens([1, 1, 1, 1], 100, min_bins=3)) == 3  # e.g. another rank needs 3


def test_dynamic_micro_batches_and_restored_order():
    mask = torch.zeros(6, 10, dtype=torch.long)
    for row, n in enumerate([9, 2, 7, 3, 10, 1]):
        mask[row, :n] = 1
    indices = micro_batch_indices(mask, micro_batch_size=4, max_token_len=10)
    assert all(len(i) == 1 or mask[i].sum() <= 10 for i in indices)
    values = torch.arange(6.0)[:, None] * torch.ones(6, 3)
    assert torch.equal(restore_order([values[i] for i in indices], indices), values)
    fixed = micro_batch_indices(mask, micro_batch_size=4)
    assert [i.tolist() for i in fixed] == [[0, 1, 2, 3], [4, 5]]


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batch_losses_add_up_to_the_mini_batch_loss(mode):
    """Σ_micro agg(micro, the mini-batch's totals) == agg(mini), for any split."""
    g = torch.Generator().manual_seed(0)
    losses = torch.randn(7, 4, generator=g)
    mask = (torch.rand(7, 4, generator=g) > 0.3).float()
    mask[:, 0] = 1.0  # every response has a token: the mini-batch's sequence count is its rows
    split = [torch.tensor([0, 5]), torch.tensor([1, 2, 3]), torch.tensor([4, 6])]
    global_batch = mini_batch_totals(mask).global_batch()
    total = sum(agg_loss(losses[i], mask[i], mode, **global_batch) for i in split)
    torch.testing.assert_close(total, agg_loss(losses, mask, mode))


def test_pack_batch_hand_example():
    """Two rows, prompt 3 (left-padded), response 2 (right-padded)."""
    input_ids = torch.tensor([[0, 5, 6, 7, 0], [4, 5, 6, 7, 8]])
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    packed = pack_batch(input_ids, mask, response_length=2)
    assert packed.input_ids.tolist() == [[5, 6, 7, 4, 5, 6, 7, 8]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4]]
    assert packed.predictors.tolist() == [1, 5, 6]  # the token before each valid response token
    assert packed.labels.tolist() == [7, 7, 8]
    assert packed.unpack(torch.tensor([1.0, 2.0, 3.0])).tolist() == [[1.0, 0.0], [2.0, 3.0]]
    assert packed.keep_columns.tolist() == [1, 5, 6] and packed.kept_index.tolist() == [0, 1, 2]


def test_pack_batch_in_rows_of_a_width():
    """Three rows of 3, 5 and 2 valid tokens in rows of 5: [row 1], [row 0, row 2]; the tail is filler."""
    input_ids = torch.tensor([[0, 5, 6, 7, 0], [4, 5, 6, 7, 8], [0, 0, 3, 9, 0]])
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1], [0, 0, 1, 1, 0]])
    packed = pack_batch(input_ids, mask, response_length=2, width=5)
    assert packed.input_ids.tolist() == [[4, 5, 6, 7, 8], [5, 6, 7, 3, 9]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]]
    assert packed.predictors.tolist() == [6, 2, 3, 8]  # flat indices into (2, 5), in (row, column) order
    assert packed.labels.tolist() == [7, 7, 8, 9]
    per_position = torch.arange(10.0).view(2, 5)[:, packed.keep_columns]  # what logits_to_keep selects
    assert packed.gather(per_position).tolist() == [6.0, 2.0, 3.0, 8.0]
    assert packed.unpack(torch.tensor([1.0, 2.0, 3.0, 4.0])).tolist() == [[1.0, 0.0], [2.0, 3.0], [4.0, 0.0]]
    assert pack_batch(input_ids, mask, 2, width=3).input_ids.shape == (2, 5)  # a width below a row's length grows


def test_pack_width_widens_rows_only_where_sequences_leave_room(tiny_model_dir):
    """Full sequences keep the padded width; 7-of-12-token ones share wider rows, in fewer token slots."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    full = torch.ones(8, 12, dtype=torch.long)
    assert pack_width(model, full) == 12
    short = full.clone()
    short[:, :5] = 0
    width = pack_width(model, short)
    assert width > 12 and width % 12 == 0
    assert len(best_fit_decreasing([7] * 8, width)) * width < 8 * 12
    assert pack_width(torch.nn.Linear(2, 2), short) == 12  # no named transformer blocks: the padded width


@pytest.mark.parametrize("capacity", [5, 8, 13])
def test_best_fit_decreasing_packs_every_index_once_within_capacity(capacity):
    lengths = torch.randint(1, capacity + 1, (50,), generator=torch.Generator().manual_seed(capacity)).tolist()
    bins = best_fit_decreasing(lengths, capacity)
    assert sorted(i for b in bins for i in b) == list(range(50))
    assert all(sum(lengths[i] for i in b) <= capacity for b in bins)
    assert len(bins) <= 11 / 9 * -(-sum(lengths) // capacity) + 1


def _rank_bins(rank: int, port: int, queue) -> None:
    init_gloo(rank, 2, port)
    mask = torch.ones(4, 8, dtype=torch.long)
    if rank == 0:
        mask[:, 2:] = 0  # 4 × 2 tokens: one micro-batch of budget 8 would do
    cpu = torch.device("cpu")
    totals = mini_batch_totals(mask[:, -4:], sync_device=cpu)  # response = the last 4 columns
    queue.put((rank, len(micro_batch_indices(mask, 4, max_token_len=8, sync_device=cpu)), totals))
    dist.destroy_process_group()  # a gloo group left to interpreter exit can abort the process (SIGABRT)


@pytest.mark.timeout(120)
def test_ranks_agree_on_micro_batch_count_and_mini_batch_totals():
    """FSDP needs the same number of forwards on every rank: the short rank splits as often as the long one.
    Loss weights use the mini-batch's tokens and rows over both ranks."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_rank_bins, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    results = {rank: (count, totals) for rank, count, totals in (queue.get() for _ in range(2))}
    assert {rank: count for rank, (count, _) in results.items()} == {0: 4, 1: 4}
    assert results[0][1] == results[1][1] == BatchTotals(tokens=16.0, rows=8.0, ranks=2)


# --------------------------------------------------------------------------------- the same numbers as padded


def _actor(model_dir, remove_padding=False, **cfg):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = actor_config(ppo_mini_batch_size=ROWS, grad_clip=1e9, **cfg)
    ref = None
    if config.kl_loss_type == "full":  # a reference that differs from the policy, the same in every variant
        torch.manual_seed(0)
        ref = AutoModelForCausalLM.from_pretrained(model_dir).requires_grad_(False)
        with torch.no_grad():
            for p in ref.parameters():
                p.add_(0.05 * torch.randn_like(p))
    return DataParallelPPOActor(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        None,
        config,
        use_remove_padding=remove_padding,
        ref_module=ref,
    )


def _step(worker, update, data) -> tuple[dict[str, torch.Tensor], dict[str, list[float]]]:
    """One SGD step with lr 1: the parameter change is minus the accumulated gradient."""
    before = {k: v.detach().clone() for k, v in worker.module.named_parameters()}
    metrics = update(data)
    return {k: before[k] - v.detach() for k, v in worker.module.named_parameters()}, metrics


def _assert_same_update(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """Equal up to float32 summation order: 1e-5 of each tensor's largest entry."""
    for name, expected in want.items():
        scale = float(expected.abs().max())
        torch.testing.assert_close(
            got[name], expected, rtol=1e-4, atol=1e-5 * scale, msg=lambda m, name=name: f"{name}: {m}"
        )


def test_packed_log_probs_match_padded_in_row_order(tiny_model_dir):
    data = make_update_batch(ROWS, P, R)
    mask = data.batch["response_mask"].bool()
    padded = _actor(tiny_model_dir)
    packed = _actor(tiny_model_dir, remove_padding=True)
    lp, ent = padded.compute_log_prob(data, micro_batch_size=ROWS, temperature=0.7, calculate_entropy=True)
    for max_token_len in (None, 20):  # 20 tokens: about two rows per micro-batch, rows regrouped by length
        plp, pent = packed.compute_log_prob(data, 3, 0.7, calculate_entropy=True, max_token_len=max_token_len)
        torch.testing.assert_close(plp[mask], lp[mask], **TOL)
        torch.testing.assert_close(pent[mask], ent[mask], **TOL)
        assert (plp[~mask] == 0).all()


def test_rows_of_a_width_and_one_row_give_the_same_logits(tiny_model_dir):
    """The sdpa layout (rows of the padded width) and the flash-attention one (a single row) agree."""
    data = make_update_batch(ROWS, P, R)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    logits = []
    for width in (None, P + R):
        packed = pack_batch(data.batch["input_ids"], data.batch["attention_mask"], R, width)
        with torch.no_grad():
            out = model(
                input_ids=packed.input_ids,
                position_ids=packed.position_ids,
                use_cache=False,
                logits_to_keep=packed.keep_columns,
            )
        logits.append(packed.gather(out.logits))
    assert logits[0].shape[0] == int(data.batch["response_mask"].sum())
    torch.testing.assert_close(logits[1], logits[0], **TOL)


@pytest.mark.parametrize(("mode", "kl_type"), [(m, "low_var_kl") for m in LOSS_AGG_MODES] + [("token-mean", "full")])
def test_actor_update_has_the_padded_full_batch_gradient(tiny_model_dir, mode, kl_type):
    """Padded in one micro-batch == padded in uneven micro-batches == packed with a token budget."""
    data = make_update_batch(ROWS, P, R)
    cfg = dict(loss_agg_mode=mode, entropy_coeff=0.01, use_kl_loss=True, kl_loss_type=kl_type)
    reference = _actor(tiny_model_dir, ppo_micro_batch_size_per_gpu=ROWS, **cfg)
    want, want_metrics = _step(reference, reference.update_policy, data)
    variants = [
        _actor(tiny_model_dir, ppo_micro_batch_size_per_gpu=3, **cfg),
        _actor(tiny_model_dir, True, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=20, **cfg),
    ]
    for actor in variants:
        got, metrics = _step(actor, actor.update_policy, data)
        assert len(metrics["actor/pg_loss"]) > 1  # it really accumulated over several micro-batches
        _assert_same_update(got, want)
        torch.testing.assert_close(metrics["actor/grad_norm"], want_metrics["actor/grad_norm"], rtol=1e-4, atol=0)


def test_packed_micro_batch_losses_match_padded(tiny_model_dir):
    """Same micro-batches, packed or padded: the same per-micro-batch losses."""
    data = make_update_batch(ROWS, P, R)
    _, padded = _step(a := _actor(tiny_model_dir, ppo_micro_batch_size_per_gpu=2), a.update_policy, data)
    _, packed = _step(b := _actor(tiny_model_dir, True, ppo_micro_batch_size_per_gpu=2), b.update_policy, data)
    for key in ("actor/pg_loss", "actor/entropy", "actor/ppo_kl", "actor/pg_clipfrac"):
        torch.testing.assert_close(packed[key], padded[key], **TOL)


def _critic(model_dir, remove_padding=False, **cfg):
    torch.manual_seed(0)
    model = load_value_model(model_dir)
    with torch.no_grad():
        model.score.weight.normal_()  # a non-zero head, so values depend on the backbone
    model_config = CriticModelConfig(path=model_dir, use_remove_padding=remove_padding)
    config = critic_config(
        model_dir, ppo_mini_batch_size=ROWS, grad_clip=1e9, cliprange_value=0.05, model=model_config, **cfg
    )
    return DataParallelPPOCritic(model, torch.optim.SGD(model.parameters(), lr=1.0), None, config)


def test_critic_values_and_gradient_match_padded(tiny_model_dir):
    data = make_update_batch(ROWS, P, R)
    data.batch["returns"] = torch.randn(ROWS, R, generator=torch.Generator().manual_seed(1))
    reference = _critic(tiny_model_dir, ppo_micro_batch_size_per_gpu=ROWS)
    dynamic = dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=20, forward_max_token_len_per_gpu=25)
    packed = _critic(tiny_model_dir, True, **dynamic)
    values = reference.compute_values(data)
    torch.testing.assert_close(packed.compute_values(data), values, **TOL)
    data.batch["values"] = values + 0.1 * torch.randn(ROWS, R, generator=torch.Generator().manual_seed(2))
    want, _ = _step(reference, reference.update_critic, data)
    got, metrics = _step(packed, packed.update_critic, data)
    assert len(metrics["critic/vf_loss"]) > 1
    _assert_same_update(got, want)
