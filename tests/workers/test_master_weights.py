"""MasterWeights: one rank computing in bf16 without FSDP does FSDP mixed precision's arithmetic."""

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM

from tests.workers.helpers import actor_config, free_port, full_weights, init_gloo, make_update_batch
from workers.compute.actor import DataParallelPPOActor
from workers.parallel import fsdp
from workers.parallel.master_weights import MasterWeights, cast_parameters
from workers.parallel.optim import build_optimizer

BF16 = torch.bfloat16
P, R, ROWS = 6, 5, 8


def _masters(model_dir: str) -> MasterWeights:
    return MasterWeights(AutoModelForCausalLM.from_pretrained(model_dir), BF16)


def test_the_compute_copy_is_bf16_with_fp32_buffers_and_tied_weights_kept(tiny_model_dir):
    weights = _masters(tiny_model_dir)
    module, master = weights.module, weights.master
    assert {p.dtype for p in module.parameters()} == {BF16}
    assert {p.dtype for p in master.parameters()} == {torch.float32}
    assert {b.dtype for b in module.buffers()} == {torch.float32}  # RoPE's inv_freq keeps its precision
    assert module.lm_head.weight is module.model.embed_tokens.weight  # still tied
    for p, m in zip(module.parameters(), master.parameters()):
        assert p is not m and torch.equal(p, m.to(BF16))


def test_gradients_accumulate_in_fp32_on_the_masters(tiny_model_dir):
    weights = _masters(tiny_model_dir)
    reference = cast_parameters(AutoModelForCausalLM.from_pretrained(tiny_model_dir), BF16)  # no hooks
    ids = [torch.randint(3, 40, (2, 7), generator=torch.Generator().manual_seed(s)) for s in (0, 1)]
    expected = [torch.zeros_like(m, dtype=torch.float32) for m in weights.master.parameters()]
    for batch in ids:
        weights.module(batch).logits.float().logsumexp(-1).mean().backward()
        reference.zero_grad()
        reference(batch).logits.float().logsumexp(-1).mean().backward()
        for total, p in zip(expected, reference.parameters()):
            total += p.grad.float()
    assert all(p.grad is None for p in weights.module.parameters())  # moved to the masters as they arrive
    for total, m in zip(expected, weights.master.parameters()):
        assert m.grad.dtype == torch.float32 and torch.allclose(m.grad, total, rtol=1e-6, atol=1e-8)


def test_a_step_clips_the_master_gradients_and_refreshes_the_module(tiny_model_dir):
    weights = _masters(tiny_model_dir)
    optimizer = build_optimizer(weights.master, actor_config().optim)
    weights.bind(optimizer)
    weights.module(torch.arange(3, 10)[None]).logits.float().logsumexp(-1).mean().backward()
    master_norm = torch.linalg.vector_norm(torch.stack([m.grad.norm() for m in weights.master.parameters()]))
    assert torch.allclose(fsdp.clip_grad_norm_(optimizer, 1e-3), master_norm) and master_norm > 0
    before = [m.detach().clone() for m in weights.master.parameters()]
    optimizer.step()
    for p, m, old in zip(weights.module.parameters(), weights.master.parameters(), before):
        assert not torch.equal(m, old) and torch.equal(p, m.detach().to(BF16))


def _updates(rank: int, port: int, model_dir: str, out: str) -> None:
    """Two PPO updates (2 micro-batches each) under 1-rank FSDP mixed precision and under MasterWeights."""
    init_gloo(rank, 1, port)
    data, config, results = make_update_batch(ROWS, P, R), actor_config(ppo_micro_batch_size_per_gpu=4), {}
    for name in ("fsdp", "master_weights"):
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        if name == "fsdp":
            module = weights_module = fsdp.apply_fsdp(model, param_dtype=BF16, reduce_dtype=torch.float32)
            optimizer = build_optimizer(module, config.optim)
        else:
            weights = MasterWeights(model, BF16)
            module, weights_module = weights.module, weights.master
            optimizer = build_optimizer(weights_module, config.optim)
            weights.bind(optimizer)
        actor = DataParallelPPOActor(module, optimizer, None, config, mini_batch_size=ROWS)
        metrics = [actor.update_policy(data) for _ in range(2)]
        results[name] = {
            "grad_norm": [m["actor/grad_norm"] for m in metrics],
            "state": full_weights(weights_module),
            "log_probs": actor.compute_log_prob(data, ROWS, 1.0)[0],
        }
    torch.save(results, out)
    dist.destroy_process_group()


def test_master_weights_update_like_one_rank_fsdp_mixed_precision(tiny_model_dir, tmp_path):
    out = str(tmp_path / "updates.pt")
    mp.spawn(_updates, args=(free_port(), tiny_model_dir, out), nprocs=1, join=True)
    fsdp_run, ours = (torch.load(out)[k] for k in ("fsdp", "master_weights"))
    assert torch.allclose(torch.tensor(ours["grad_norm"]), torch.tensor(fsdp_run["grad_norm"]), rtol=1e-4)
    for key, value in fsdp_run["state"].items():
        assert ours["state"][key].dtype == torch.float32
        assert torch.allclose(ours["state"][key], value, rtol=1e-4, atol=1e-6), key
    assert torch.allclose(ours["log_probs"], fsdp_run["log_probs"], atol=1e-3)
