"""FSDP2 over two real gloo ranks (spawned once for the module): sharded == unsharded, and no hangs.

Each rank runs every scenario in ``_rank_main`` and saves what it saw; the tests below assert on that.
"""

import math
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode
from transformers import AutoModelForCausalLM

from config.sections import FSDPConfig, ModelConfig
from tests.workers.helpers import (
    PAD,
    VOCAB,
    actor_config,
    free_port,
    full_weights,
    init_gloo,
    make_prompts,
    make_update_batch,
)
from workers.compute.actor import DataParallelPPOActor
from workers.compute.packing import mini_batch_totals
from workers.compute.rollout import generate_sequences
from workers.parallel import fsdp, lora
from workers.parallel.optim import build_optimizer
from workers.roles.role import shard_role
from workers.runtime import perf

WORLD = 2
P, R = 6, 5
ROWS = 8  # global update batch: 4 rows per rank, mini-batch 4, micro-batch 2
CPU = torch.device("cpu")


def _comm_count(fn) -> int:
    with CommDebugMode() as comm:
        fn()
    return comm.get_total_counts()


def _gathered_forwards(model, rank: int) -> dict:
    """Ranks run a different number of forwards inside gathered_params: none of them may communicate."""
    ids, mask, pos = make_prompts(2, P)
    forward = lambda: model(input_ids=ids, attention_mask=mask, position_ids=pos)  # noqa: E731
    with torch.no_grad():
        sharded_forward = _comm_count(forward)
        with fsdp.gathered_params(model):
            inside = [_comm_count(forward) for _ in range(rank + 2)]
        after = _comm_count(forward)
    return {"sharded_forward": sharded_forward, "inside": inside, "after": after}


def _uneven_rollout(model, plain, rank: int) -> dict:
    """Rank 0 ends every row at the first token, rank 1 decodes all R steps; then both must still agree."""
    ids, mask, pos = make_prompts(4, P, seed=rank)
    eos = list(range(VOCAB)) if rank == 0 else None
    kwargs = dict(response_length=R, eos_token_id=eos, pad_token_id=PAD, do_sample=False)
    with fsdp.gathered_params(model):
        out = generate_sequences(model, ids, mask, pos, **kwargs)
    flag = torch.tensor([rank + 1.0])
    dist.all_reduce(flag)  # would mismatch with a stray all-gather if decoding had communicated
    expected = generate_sequences(plain, ids, mask, pos, **kwargs)
    return {
        "lengths": out["response_mask"].sum(-1).tolist(),
        "matches_unsharded": torch.equal(out["responses"], expected["responses"]),
        "all_reduce": flag.item(),
    }


def _bf16_update(model_dir: str, data, fp32_log_probs: torch.Tensor) -> dict:
    """The same shard and update in bf16 (FSDP mixed precision): bf16 compute, fp32 sharded master weights."""
    param_dtype, reduce_dtype = fsdp.mixed_precision(CPU, "bf16")
    model = fsdp.apply_fsdp(
        AutoModelForCausalLM.from_pretrained(model_dir), param_dtype=param_dtype, reduce_dtype=reduce_dtype
    )
    config = actor_config()
    actor = DataParallelPPOActor(model, build_optimizer(model, config.optim), None, config)
    b = data.batch
    with torch.no_grad():
        log_probs, _ = actor.forward_log_prob(b["input_ids"], b["attention_mask"], b["position_ids"], R)
    metrics = actor.update_policy(data)
    return {
        "log_prob_max_diff": (log_probs - fp32_log_probs).abs().max().item(),
        "finite": all(math.isfinite(float(v)) for values in metrics.values() for v in values),
        "grad_norm": metrics["actor/grad_norm"],
        "master_dtypes": {p.dtype for p in model.parameters()},
    }


def _sharded(model) -> bool:
    return all(isinstance(p, DTensor) for p in model.parameters())


def _grouped_update(model_dir: str, data, min_num_params: int) -> dict:
    """The same update with blocks grouped into FSDP units of at least ``min_num_params`` parameters."""
    model = fsdp.apply_fsdp(AutoModelForCausalLM.from_pretrained(model_dir), min_num_params=min_num_params)
    ids, mask, pos = make_prompts(2, P)
    with torch.no_grad(), fsdp.onloaded(model, CPU):  # a log-prob phase
        comms = _comm_count(lambda: model(input_ids=ids, attention_mask=mask, position_ids=pos))
        gathered_in_phase = not _sharded(model)  # the root's group stays gathered after a no-grad forward...
    resharded = _sharded(model)  # ...until the phase ends
    config = actor_config()
    actor = DataParallelPPOActor(model, build_optimizer(model, config.optim), None, config)
    metrics = actor.update_policy(data)
    return {
        "forward_comms": comms,
        "gathered_in_phase": gathered_in_phase,
        "resharded_after_phase": resharded,
        "sharded_after_update": _sharded(model),
        "grad_norm": metrics["actor/grad_norm"],
        "updated": full_weights(model, all_ranks=True),
    }


def _lora_grads(model_dir: str, data, checkpointing: bool) -> dict:
    """The adapters' full gradients of one sharded LoRA micro-batch loss, with or without activation checkpointing
    (enabled as the workers do, before the adapters), and how often a block's MLP ran."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    torch.manual_seed(0)
    model = lora.add_adapters(model, ModelConfig(lora_rank=4, lora_alpha=8))
    with torch.no_grad():  # B away from its zero init, so every adapter gets a gradient
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    calls, mlp = [], model.base_model.model.model.layers[0].mlp
    mlp.forward = lambda *args, _forward=mlp.forward: calls.append(1) or _forward(*args)  # module hooks skip recompute
    model = fsdp.apply_fsdp(model).train()
    totals = mini_batch_totals(data.batch["response_mask"]).global_batch()
    loss, _ = DataParallelPPOActor(model, None, None, actor_config())._micro_loss(dict(data.batch.items()), 1.0, totals)
    loss.backward()
    grads = {
        n: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        for n, p in model.named_parameters()
        if p.grad is not None
    }
    return {"grads": grads, "mlp_calls": len(calls)}


def _units(model_dir: str) -> dict:
    """``fsdp.gathered_units`` over a sharded LoRA model: what the vLLM engine's sync loads, unit by unit."""
    torch.manual_seed(0)
    model = lora.add_adapters(AutoModelForCausalLM.from_pretrained(model_dir), ModelConfig(lora_rank=4, lora_alpha=8))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    params = len(list(model.named_parameters()))  # base weights and adapters
    model = fsdp.apply_fsdp(model)
    units, loaded = [], {}
    for named in fsdp.gathered_units(model):
        units.append(len(named))
        loaded.update({name: tensor.clone() for name, tensor in lora.merged_weights(model, named)})
    return {"units": units, "params": params, "loaded": loaded, "sharded_after": _sharded(model)}


def _rank_main(rank: int, port: int, model_dir: str, out_dir: str) -> None:
    init_gloo(rank, WORLD, port)
    plain = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    model = fsdp.apply_fsdp(AutoModelForCausalLM.from_pretrained(model_dir))
    result = {"gathered": _gathered_forwards(model, rank), "rollout": _uneven_rollout(model, plain, rank)}
    result["flops_equal"] = perf.FlopsModel.of(model) == perf.FlopsModel.of(plain)  # MFU counts the full model

    full = full_weights(model)  # rank 0 only
    result["full_state_dict_equal"] = rank != 0 or all(torch.equal(full[k], v) for k, v in plain.state_dict().items())

    data = make_update_batch(ROWS, P, R)[rank * ROWS // WORLD : (rank + 1) * ROWS // WORLD]
    config = actor_config()
    actor = DataParallelPPOActor(model, build_optimizer(model, config.optim), None, config)
    b = data.batch
    with torch.no_grad():
        sharded_lp, _ = actor.forward_log_prob(b["input_ids"], b["attention_mask"], b["position_ids"], R)
        plain_lp, _ = DataParallelPPOActor(plain, None, None, config).forward_log_prob(
            b["input_ids"], b["attention_mask"], b["position_ids"], R
        )
    result["log_prob_max_diff"] = (sharded_lp - plain_lp).abs().max().item()
    result["metrics"] = actor.update_policy(data)
    result["updated"] = full_weights(model, all_ranks=True)
    result["bf16"] = _bf16_update(model_dir, data, plain_lp)
    block = sum(p.numel() for p in plain.model.layers[0].parameters())
    result["grouped"] = {n: _grouped_update(model_dir, data, n) for n in (block + 1, 10**9)}  # 2 blocks; all
    result["lora_checkpointing"] = {on: _lora_grads(model_dir, data, on) for on in (False, True)}
    result["units"] = _units(model_dir)
    torch.save(result, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tiny_model_dir, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("fsdp_ranks")
    mp.spawn(_rank_main, args=(free_port(), tiny_model_dir, str(out_dir)), nprocs=WORLD, join=True)
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.mark.timeout(300)
def test_gathered_params_forwards_do_not_communicate(results):
    for r in results:
        assert r["gathered"]["sharded_forward"] > 0  # the counter does see FSDP's all-gathers
        assert r["gathered"]["inside"] == [0] * len(r["gathered"]["inside"])
        assert r["gathered"]["after"] > 0  # resharded on exit


def test_ranks_stopping_at_different_steps_do_not_hang(results):
    assert results[0]["rollout"]["lengths"] == [1] * 4
    assert results[1]["rollout"]["lengths"] == [R] * 4
    for r in results:
        assert r["rollout"]["all_reduce"] == 3.0
        assert r["rollout"]["matches_unsharded"]


def test_full_state_dict_and_log_probs_match_the_unsharded_model(results):
    assert all(r["full_state_dict_equal"] for r in results)
    assert all(r["log_prob_max_diff"] < 1e-5 for r in results)
    assert all(r["flops_equal"] for r in results)


def test_two_rank_update_equals_one_process_update_on_the_global_batch(results, tiny_model_dir):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    config = actor_config(ppo_mini_batch_size=ROWS)  # one process: the whole global mini-batch
    actor = DataParallelPPOActor(model, build_optimizer(model, config.optim), None, config)
    actor.update_policy(make_update_batch(ROWS, P, R))
    expected = model.state_dict()
    for r in results:
        assert set(r["updated"]) == set(expected)
        for name, value in r["updated"].items():
            torch.testing.assert_close(value, expected[name], rtol=1e-4, atol=1e-5, msg=name)
    assert results[0]["metrics"]["actor/grad_norm"] == pytest.approx(results[1]["metrics"]["actor/grad_norm"])
    assert any(
        not torch.equal(v, AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()[k])
        for k, v in results[0]["updated"].items()
    )


def test_one_cpu_rank_is_left_unsharded(tiny_model_dir):
    """One rank has nothing to shard: on CPU (no mixed precision) the module stays plain, without FSDP hooks."""
    assert not torch.distributed.is_initialized()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    one_rank = SimpleNamespace(device=torch.device("cpu"), world_size=1)
    module, weights = shard_role(one_rank, model, FSDPConfig(), trained=True)
    assert module is model and weights is None and not fsdp.is_fsdp(model) and not fsdp.fsdp_modules(model)


def test_two_rank_bf16_update_computes_in_bf16_and_keeps_fp32_master_weights(results):
    for r in results:
        bf16 = r["bf16"]
        assert 0 < bf16["log_prob_max_diff"] < 0.1  # bf16 rounding: close to the fp32 log-probs, not equal
        assert bf16["finite"] and bf16["master_dtypes"] == {torch.float32}
    assert results[0]["bf16"]["grad_norm"] == pytest.approx(results[1]["bf16"]["grad_norm"])  # reduced in fp32


def test_blocks_smaller_than_min_num_params_share_fsdp_groups(results):
    """wrap_policy.min_num_params: both blocks in one unit, or the whole model in the root's group. Fewer
    collectives (an all-gather per group), the same update, and every group resharded when a phase ends."""
    for r in results:
        (two_blocks, everything) = r["grouped"].values()
        assert r["gathered"]["sharded_forward"] > two_blocks["forward_comms"] > everything["forward_comms"] > 0
        for grouped in (two_blocks, everything):
            assert grouped["gathered_in_phase"] and grouped["resharded_after_phase"] and grouped["sharded_after_update"]
            assert grouped["grad_norm"] == pytest.approx(r["metrics"]["actor/grad_norm"], rel=1e-5)
            for name, value in grouped["updated"].items():
                torch.testing.assert_close(value, r["updated"][name], rtol=1e-5, atol=1e-6, msg=name)


def test_block_units_group_consecutive_blocks_up_to_min_num_params():
    blocks = [torch.nn.Linear(10, 10) for _ in range(5)]  # 110 parameters each
    assert fsdp.block_units(blocks) == [[b] for b in blocks]
    assert fsdp.block_units(blocks, 200) == [blocks[0:2], blocks[2:4]]  # the fifth stays in the root's group
    assert fsdp.block_units(blocks, 330) == [blocks[0:3]]
    assert fsdp.block_units(blocks, 10**6) == []


def test_activation_checkpointing_with_lora_and_fsdp2_gives_the_same_gradients(results):
    """enable_gradient_checkpointing with LoRA adapters on 2 FSDP2 ranks: the blocks run again in backward, and
    every adapter's gradient equals the one without checkpointing."""
    for r in results:
        plain, checkpointed = r["lora_checkpointing"][False], r["lora_checkpointing"][True]
        assert (plain["mlp_calls"], checkpointed["mlp_calls"]) == (1, 2)  # recomputed in backward
        assert set(plain["grads"]) == set(checkpointed["grads"]) and all("lora_" in n for n in plain["grads"])
        assert len(plain["grads"]) > 0
        for name, grad in checkpointed["grads"].items():
            assert grad.abs().sum() > 0, name
            torch.testing.assert_close(grad, plain["grads"][name], rtol=1e-5, atol=1e-7, msg=name)


def test_gathered_units_give_every_full_weight_once_merged_and_leave_the_model_sharded(results, tiny_model_dir):
    """What the vLLM engine loads: every base weight under its checkpoint name, once, full, with the LoRA adapters
    merged in (W + (α/r)·B·A, as peft's merge computes it), a unit at a time, and the model sharded after."""
    torch.manual_seed(0)
    model = lora.add_adapters(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), ModelConfig(lora_rank=4, lora_alpha=8)
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    expected = dict(model.merge_and_unload().named_parameters())
    for r in results:
        units = r["units"]
        assert units["sharded_after"] and len(units["units"]) > 1  # the root's own, then each block's
        assert sum(units["units"]) == units["params"]  # each parameter in one unit's list, adapters included
        assert set(units["loaded"]) == set(expected)
        for name, tensor in units["loaded"].items():
            torch.testing.assert_close(tensor, expected[name], rtol=1e-6, atol=1e-6)
