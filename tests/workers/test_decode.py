"""The compiled decode step (``workers.compute.decode``): the same tokens as the HF loop (greedy, fp32 exactly;
rows leaving at bucket boundaries; shared prompts; partial rollouts' budgets and quotas), bf16 log-probs within the
stated bound, buckets, no recompilation after warm-up, and (``gpu``) CUDA graphs replayed per bucket."""

import copy
import functools
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from config.sections.rollout import RolloutConfig
from single_controller import DataProto
from tests.workers.helpers import PAD, actor_config, make_prompts
from workers.compute import decode, decode_loop
from workers.compute.actor import DataParallelPPOActor
from workers.compute.decode_loop import Partial
from workers.compute.rollout import generate_sequences
from workers.compute.turn_sampler import HFTurnSampler
from workers.parallel import lora

P, R = 6, 12


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@pytest.fixture(autouse=True)
def often(monkeypatch):
    """Check for ended rows every 2 tokens, so the tiny responses cross bucket boundaries."""
    monkeypatch.setattr(decode_loop, "EOS_CHECK_INTERVAL", 2)


def _prompts(batch=8, n=1, seed=4):
    ids, mask, pos = make_prompts(batch // n, P, seed=seed)
    return [t.repeat_interleave(n, dim=0) for t in (ids, mask, pos)]


def _eos_that_ends_most(model, prompts):
    """Tokens that end all but the last two rows early (their second greedy token), so rows leave the batch."""
    free = generate_sequences(model, *prompts, response_length=R, eos_token_id=None, pad_token_id=PAD, do_sample=False)
    tokens = free["responses"]
    return sorted(set(tokens[:-2, 1].tolist()) - set(tokens[-2:].flatten().tolist()))


def _both(model, prompts, compiled=False, **kwargs):
    kwargs = dict(response_length=R, pad_token_id=PAD, do_sample=False, return_log_probs=True, **kwargs)
    return generate_sequences(model, *prompts, **kwargs), decode.generate(model, *prompts, compiled=compiled, **kwargs)


def _assert_same(hf, ours, exact=True):
    assert hf.keys() == ours.keys()
    for key in hf:
        if key == "rollout_log_probs":
            torch.testing.assert_close(ours[key], hf[key], atol=1e-5 if exact else 0.1, rtol=0)
        else:
            assert torch.equal(ours[key], hf[key]), key


def test_buckets():
    assert decode.buckets(1) == [1] and decode.buckets(8) == [1, 2, 4, 8] and decode.buckets(6) == [1, 2, 4, 6]
    assert [decode.bucket(n, 6) for n in range(1, 7)] == [1, 2, 4, 4, 6, 6]


@pytest.mark.parametrize("n", [1, 2], ids=["distinct", "shared-prompts"])
def test_greedy_tokens_equal_the_hf_loop_as_rows_leave(model, n):
    """fp32, greedy: the same responses, masks and positions, log-probs equal to rounding; most rows end early, so
    the batch shrinks through the buckets 8 -> 2 (spare rows pad a bucket)."""
    prompts = _prompts(n=n)
    eos = _eos_that_ends_most(model, prompts)
    hf, ours = _both(model, prompts, eos_token_id=eos)
    assert int((hf["response_mask"].sum(-1) <= 2).sum()) >= 4  # rows did leave
    _assert_same(hf, ours)


def test_a_partial_piece_stops_as_the_hf_loop_does(model):
    """Budgets end rows, the quota of complete groups stops the piece early, ``ended`` says which rows ended."""
    prompts = _prompts(batch=6, n=2)
    group = torch.arange(6) // 2
    budget = torch.tensor([3, 3, R, R, 5, R])
    for quota, required in ((1, torch.zeros(6, dtype=torch.bool)), (0, torch.tensor([0, 0, 1, 0, 0, 0]).bool())):
        piece = Partial(budget, group, quota, required)
        hf, ours = _both(model, prompts, eos_token_id=None, partial=piece)
        _assert_same(hf, ours)


def test_a_partial_piece_ends_in_a_bucket_with_spare_rows_as_the_hf_loop_does(model):
    """Five of eight rows end at their budget, so three decode on in a bucket of four (one spare row): ``ended``
    and the outputs cover the batch's rows only."""
    prompts = _prompts(batch=8, n=2)
    budget = torch.tensor([3, 3, 3, 3, 3, R, R, R])
    piece = Partial(budget, torch.arange(8) // 2, 4, torch.zeros(8, dtype=torch.bool))
    hf, ours = _both(model, prompts, eos_token_id=None, partial=piece)
    _assert_same(hf, ours)
    assert ours["ended"].tolist() == [True] * 8


def test_bf16_log_probs_stay_within_the_stated_bound(model):
    """bf16: the rollout's log-probs within 0.1 of the HF loop's (docs' bf16 bound), most tokens the same."""
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    hf, ours = _both(bf16, _prompts(), eos_token_id=None)
    same = hf["responses"] == ours["responses"]
    assert same.float().mean() > 0.9
    first = same.long().cumprod(-1).bool()  # up to a row's first differing token the prefixes agree
    gap = (hf["rollout_log_probs"] - ours["rollout_log_probs"]).abs()[first]
    assert gap.max() < 0.1, gap.max()


def test_bf16_lora_sampled_merged_stays_within_the_stated_bound_of_its_unmerged_forward(tiny_model_dir):
    """bf16 LoRA samples with W + ΔW merged into one bf16 weight (rounded once); the rollout's log-probs, through
    the HF loop and the decode step, stay within the bf16 bound the docs state for a rollout against the update's
    forward (max 0.1, mean 0.02), which here runs peft's unmerged adapters. ΔW matters: the base model is far."""
    adapters = SimpleNamespace(lora_rank=4, lora_alpha=8, target_modules="all-linear")
    model = lora.add_adapters(AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapters)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    model = model.to(torch.bfloat16).eval()
    actor = DataParallelPPOActor(model, None, None, actor_config())
    for sampler in (generate_sequences, functools.partial(decode.generate, compiled=False)):
        with lora.merged_adapters(model):
            out = sampler(
                model,
                *_prompts(),
                response_length=R,
                eos_token_id=None,
                pad_token_id=PAD,
                generator=torch.Generator().manual_seed(0),
                return_log_probs=True,
            )
        recomputed = actor.compute_log_prob(DataProto.from_dict(out), micro_batch_size=8)[0]
        gap = (out["rollout_log_probs"] - recomputed).abs()
        assert gap.max() < 0.1 and gap.mean() < 0.02, (sampler, gap.max(), gap.mean())
        with lora.as_reference(model):
            base = actor.compute_log_prob(DataProto.from_dict(out), micro_batch_size=8)[0]
        assert (out["rollout_log_probs"] - base).abs().mean() > 0.1


def test_nothing_recompiles_after_warm_up(model, monkeypatch):
    """One graph per bucket (dynamo, eager backend: fast); a second rollout with new weights of the same shapes
    and the same buckets compiles nothing (``error_on_recompile``)."""
    torch._dynamo.reset()
    monkeypatch.setitem(decode._COMPILED, "default", torch.compile(decode.decode_step, backend="eager", dynamic=False))
    prompts = _prompts()
    eos = _eos_that_ends_most(model, prompts)
    hf, ours = _both(model, prompts, compiled=True, eos_token_id=eos)
    _assert_same(hf, ours)
    frames = torch._dynamo.utils.counters["frames"]["ok"]
    assert 1 < frames <= len(decode.buckets(8))
    other = copy.deepcopy(model)  # new weight tensors, same shapes
    with torch._dynamo.config.patch(error_on_recompile=True):
        decode.generate(
            other, *prompts, compiled=True, response_length=R, pad_token_id=PAD, eos_token_id=eos, do_sample=False
        )
    assert torch._dynamo.utils.counters["frames"]["ok"] == frames


def test_compile_decode_setting(model):
    """true compiles the own step, auto runs it eager on a CPU, false keeps the HF loop; and ``auto`` is what
    the rollout and the multi-turn sampler run when nothing is set."""
    assert decode.resolve(True, model) == decode.resolve("true", model) == "compiled"
    assert decode.resolve("auto", model) == "eager"
    assert decode.resolve(False, model) == decode.resolve("false", model) == "hf"
    assert RolloutConfig().compile_decode == "auto"
    assert HFTurnSampler(model, compile_decode="auto").step is decode.decode_step
    assert HFTurnSampler(model, compile_decode=False).step is None


@pytest.mark.gpu
def test_cuda_graphs_give_the_hf_loops_greedy_tokens(tiny_model_dir):
    """On CUDA each bucket's graph is captured and replayed (``reduce-overhead``): fp32, greedy, rows leaving
    through the buckets 8 -> 2, the same tokens as the HF loop on the same device, log-probs to rounding."""
    torch._dynamo.reset()
    cuda = AutoModelForCausalLM.from_pretrained(tiny_model_dir).to("cuda").eval()
    assert decode.compile_mode(next(cuda.parameters()).device) == "reduce-overhead"
    prompts = _prompts()  # on the host, as a worker's batch arrives
    eos = _eos_that_ends_most(cuda, prompts)
    hf, ours = _both(cuda, prompts, compiled=True, eos_token_id=eos)
    assert int((hf["response_mask"].sum(-1) <= 2).sum()) >= 4  # rows did leave
    assert hf.keys() == ours.keys() and ours["responses"].is_cuda
    for key in hf:
        if key == "rollout_log_probs":
            torch.testing.assert_close(ours[key], hf[key], atol=1e-4, rtol=0)
        else:
            assert torch.equal(ours[key], hf[key]), key


@pytest.mark.slow
def test_inductor_through_every_bucket(model):
    """Inductor compiles the buckets 8, 4, 2, 1 (rows end one by one); the tokens are the HF loop's exactly."""
    torch._dynamo.reset()
    prompts = _prompts()
    free = generate_sequences(model, *prompts, response_length=R, eos_token_id=None, pad_token_id=PAD, do_sample=False)
    eos = sorted(set(free["responses"][:7, 1].tolist()) - set(free["responses"][7].tolist()))
    hf, ours = _both(model, prompts, compiled=True, eos_token_id=eos)
    _assert_same(hf, ours)
