"""Rollout: output layout, EOS handling, sampling filters, greedy equality with HF ``generate``, one prefill per
prompt group, and the rollout's log-probs against a recomputed forward."""

import copy
import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM, StaticCache

from config.sections import ActorRolloutRefConfig, RefConfig, RolloutConfig
from planner import make_plan
from planner.phases import STEP_FLOW
from single_controller import DataProto
from tests.workers.helpers import PAD, VOCAB, actor_config, make_prompts, worker_config
from workers.compute import decode_loop
from workers.compute.actor import DataParallelPPOActor
from workers.compute.decode_loop import filter_logits, sample_next_token
from workers.compute.rollout import generate_sequences

P, R = 6, 8


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def _generate(model, batch=6, **kwargs):
    input_ids, attention_mask, position_ids = make_prompts(batch, P, seed=1)
    kwargs = {"response_length": R, "pad_token_id": PAD, "eos_token_id": None, **kwargs}
    return generate_sequences(model, input_ids, attention_mask, position_ids, **kwargs)


def test_output_layout_and_eos(model):
    # a common token as EOS, so some rows stop early and some do not
    g = torch.Generator().manual_seed(0)
    eos = int(_generate(model, do_sample=True, generator=g)["responses"][:, 2].mode().values)
    out = _generate(model, do_sample=True, eos_token_id=eos, generator=torch.Generator().manual_seed(0))
    prompts = make_prompts(6, P, seed=1)[0]
    responses, mask = out["responses"], out["response_mask"]
    assert set(out) == {"responses", "input_ids", "attention_mask", "position_ids", "response_mask"}
    assert responses.shape == mask.shape == (6, R)
    assert out["input_ids"].shape == out["attention_mask"].shape == out["position_ids"].shape == (6, P + R)
    assert torch.equal(out["input_ids"], torch.cat([prompts, responses], -1))
    assert torch.equal(out["attention_mask"][:, P:], mask)
    stopped = 0
    for row in range(6):
        hits = (responses[row] == eos).nonzero().flatten()
        length = int(hits[0]) + 1 if len(hits) else R  # valid tokens include the EOS itself
        stopped += bool(len(hits))
        assert mask[row].tolist() == [1] * length + [0] * (R - length)
        assert (responses[row, length:] == PAD).all()
    assert stopped > 0
    last_prompt_pos = out["position_ids"][:, P - 1 : P]
    assert torch.equal(out["position_ids"][:, P:], last_prompt_pos + torch.arange(1, R + 1))


def test_all_rows_stop_at_first_step_still_give_full_width(model):
    out = _generate(model, do_sample=False, eos_token_id=list(range(VOCAB)))  # every token ends the row
    assert out["responses"].shape == (6, R)
    assert out["response_mask"].sum(-1).tolist() == [1] * 6
    assert (out["responses"][:, 1:] == PAD).all()


def test_greedy_matches_hf_generate(model):
    input_ids, attention_mask, position_ids = make_prompts(6, P, seed=3)
    ours = generate_sequences(
        model,
        input_ids,
        attention_mask,
        position_ids,
        response_length=R,
        eos_token_id=None,
        pad_token_id=PAD,
        do_sample=False,
    )["responses"]
    eos = int(ours[0, 3])  # stops row 0 (and maybe others) early in the run below
    ours = generate_sequences(
        model,
        input_ids,
        attention_mask,
        position_ids,
        response_length=R,
        eos_token_id=eos,
        pad_token_id=PAD,
        temperature=0.0,
    )["responses"]
    hf = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=R,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=PAD,
    )[:, P:]
    hf = torch.nn.functional.pad(hf, (0, R - hf.shape[1]), value=PAD)
    assert len(set(ours[:, 0].tolist())) > 1, "degenerate model: every prompt gives the same token"
    assert torch.equal(ours, hf)


def test_greedy_matches_hf_generate_when_ended_rows_leave_the_batch(model):
    """Most rows end at their second token, so the decode batch shrinks; every row still decodes as HF's does."""
    input_ids, attention_mask, position_ids = make_prompts(8, P, seed=4)
    kwargs = dict(response_length=R, pad_token_id=PAD, do_sample=False)
    free = generate_sequences(model, input_ids, attention_mask, position_ids, eos_token_id=None, **kwargs)["responses"]
    eos = sorted(set(free[:6, 1].tolist()) - set(free[6:, :].flatten().tolist()))  # rows 6, 7 never end
    ours = generate_sequences(model, input_ids, attention_mask, position_ids, eos_token_id=eos, **kwargs)
    lengths = ours["response_mask"].sum(-1)
    assert int((lengths <= 2).sum()) >= 4 and (lengths[6:] == R).all()  # half the rows leave after 2 tokens
    hf = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=R,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=PAD,
    )[:, P:]
    assert torch.equal(ours["responses"], hf)


def test_top_k_one_and_tiny_top_p_are_greedy(model):
    greedy = _generate(model, do_sample=False)["responses"]
    top_k = _generate(model, top_k=1, temperature=2.0, generator=torch.Generator().manual_seed(0))["responses"]
    top_p = _generate(model, top_p=1e-6, temperature=2.0, generator=torch.Generator().manual_seed(0))["responses"]
    assert torch.equal(top_k, greedy) and torch.equal(top_p, greedy)


def test_filter_logits_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda x: torch.isfinite(x)[0].tolist()  # noqa: E731
    assert kept(filter_logits(logits, top_k=2)) == [True, True, False, False]
    assert kept(filter_logits(logits, top_p=0.7)) == [True, True, False, False]  # 0.5 < 0.7 ≤ 0.8
    assert kept(filter_logits(logits, top_p=0.45)) == [True, False, False, False]
    assert kept(filter_logits(logits, top_k=-1, top_p=1.0)) == [True] * 4
    assert kept(filter_logits(logits, top_k=None)) == [True] * 4


def test_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(4000, 3)
    tokens = sample_next_token(logits, temperature=1.0, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=3) / 4000
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.03)


def test_sampling_never_picks_a_filtered_token():
    # top-k keeps tokens 2 and 4 (the last one); 0, 1 and 3 have probability 0 and must never come out
    logits = torch.tensor([[0.0, -1.0, 5.0, -2.0, 4.0]]).expand(20000, 5)
    tokens = sample_next_token(logits, top_k=2, generator=torch.Generator().manual_seed(0))
    assert set(tokens.unique().tolist()) == {2, 4}
    # the most likely token first and everything after it filtered
    only_first = sample_next_token(torch.tensor([[9.0, 1.0, 1.0]]).expand(1000, 3), top_k=1)
    assert (only_first == 0).all()


def _naive_prefill(model, input_ids, attention_mask, position_ids, max_cache_len):
    """Every row prefilled as it is, left padding included: what the rollout did before prompt groups."""
    cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
    mask = torch.cat([attention_mask, attention_mask.new_zeros(len(attention_mask), max_cache_len - P)], dim=-1)
    return cache, decode_loop.next_token_logits(model, input_ids, mask, position_ids, cache)


def _grouped_prompts(n=3, prompts=4, seed=5, extra_padding=0):
    """``prompts`` prompts, each repeated ``n`` times in a row; ``extra_padding`` more pad columns on the left."""
    ids, mask, pos = make_prompts(prompts, P - extra_padding, seed=seed)
    pad = (extra_padding, 0)
    ids, mask, pos = (torch.nn.functional.pad(t, pad) for t in (ids, mask, pos))
    return [t.repeat_interleave(n, dim=0) for t in (ids, mask, pos)]


@pytest.mark.parametrize(
    "sampling", [dict(do_sample=False), dict(temperature=0.8, top_k=10)], ids=["greedy", "sampled"]
)
def test_a_prompt_group_shares_one_prefill_and_generates_the_same(model, monkeypatch, sampling):
    """n rows of a prompt: one prefill of the distinct prompts, packed without their left padding; the tokens are
    those of prefilling every row on its own (greedy, and sampled with the same generator)."""
    ids, mask, pos = _grouped_prompts(extra_padding=2)
    kwargs = dict(response_length=R, eos_token_id=None, pad_token_id=PAD, return_log_probs=True, **sampling)
    prefill_inputs = []
    hook = model.model.embed_tokens.register_forward_hook(lambda m, args, out: prefill_inputs.append(args[0].shape))
    try:
        shared = generate_sequences(model, ids, mask, pos, generator=torch.Generator().manual_seed(0), **kwargs)
    finally:
        hook.remove()
    # the 4 distinct prompts once, in rows no wider than the longest: at most its padding, not the batch's
    assert int(mask[::3].sum()) <= prefill_inputs[0].numel() <= 4 * int(mask.sum(-1).max()) < mask[::3].numel()
    monkeypatch.setattr(decode_loop, "prefill", _naive_prefill)
    alone = generate_sequences(model, ids, mask, pos, generator=torch.Generator().manual_seed(0), **kwargs)
    assert torch.equal(shared["responses"], alone["responses"])
    torch.testing.assert_close(shared["rollout_log_probs"], alone["rollout_log_probs"], rtol=1e-5, atol=1e-5)
    if not sampling.get("do_sample", True):
        assert torch.equal(shared["responses"][::3], shared["responses"][1::3])  # greedy: a group agrees


def test_prefill_lays_out_the_padded_batch_cache(model):
    """The packed prefill's keys and values sit where a padded prefill puts them; its logits are the same."""
    ids, mask, pos = _grouped_prompts(n=2)
    cache, logits = decode_loop.prefill(model, ids, mask, pos, P + R)
    want_cache, want_logits = _naive_prefill(model, ids, mask, pos, P + R)
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-5)
    valid = mask.bool()[:, None, :, None]  # (B, 1, P, 1): padding columns hold nothing either way
    for got, want in zip(cache.layers, want_cache.layers):
        for a, b in ((got.keys, want.keys), (got.values, want.values)):
            torch.testing.assert_close((a[:, :, :P] * valid), (b[:, :, :P] * valid), rtol=1e-5, atol=1e-5)
        assert int(got.cumulative_length) == P


@pytest.mark.parametrize("remove_padding", [False, True], ids=["padded", "remove-padding"])
def test_rollout_log_probs_match_a_recomputed_forward(model, remove_padding):
    """fp32: each sampled token's rollout log-prob (temperature-scaled, top-k not applied) equals the actor's
    recomputed old log-prob within 1e-5, rows that end early (and leave the decode batch) included."""
    ids, mask, pos = _grouped_prompts(n=2, prompts=5)
    g = torch.Generator().manual_seed(0)
    eos = int(
        generate_sequences(model, ids, mask, pos, response_length=R, eos_token_id=None, pad_token_id=PAD, generator=g)[
            "responses"
        ][:, 1]
        .mode()
        .values
    )
    out = generate_sequences(
        model,
        ids,
        mask,
        pos,
        response_length=R,
        eos_token_id=eos,
        pad_token_id=PAD,
        temperature=0.7,
        top_k=8,
        generator=torch.Generator().manual_seed(1),
        return_log_probs=True,
    )
    lengths = out["response_mask"].sum(-1)
    assert (lengths < R).any() and (lengths == R).any()
    actor = DataParallelPPOActor(model, None, None, actor_config(), use_remove_padding=remove_padding)
    recomputed, _ = actor.compute_log_prob(DataProto.from_dict(out), micro_batch_size=4, temperature=0.7)
    torch.testing.assert_close(out["rollout_log_probs"], recomputed, rtol=0, atol=1e-5)
    assert (out["rollout_log_probs"][out["response_mask"] == 0] == 0).all()


def test_bf16_rollout_log_probs_stay_within_a_stated_bound(model):
    """bf16 (the same module for sampling and training): decoding with a KV cache rounds differently from a full
    forward; the rollout's log-probs stay within 0.1 of the recomputed ones (mean gap under 0.02)."""
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    ids, mask, pos = _grouped_prompts(n=2, prompts=4)
    out = generate_sequences(
        bf16,
        ids,
        mask,
        pos,
        response_length=R,
        eos_token_id=None,
        pad_token_id=PAD,
        generator=torch.Generator().manual_seed(0),
        return_log_probs=True,
    )
    actor = DataParallelPPOActor(bf16, None, None, actor_config())
    recomputed, _ = actor.compute_log_prob(DataProto.from_dict(out), micro_batch_size=8)
    gap = (out["rollout_log_probs"] - recomputed).abs()
    assert gap.max() < 0.1 and gap.mean() < 0.02, (gap.max(), gap.mean())


@pytest.mark.parametrize("mini, in_reward, from_rollout", [(2, False, True), (4, True, True), (4, False, False)])
def test_the_plan_takes_old_log_probs_from_the_rollout(mini, in_reward, from_rollout):
    """rollout.calculate_log_probs: no old-log-prob forward; the update reads them. One on-policy optimizer step
    (mini-batch = batch) needs neither, unless the in-reward KL reads them."""
    rollout_config = RolloutConfig(n=2, calculate_log_probs=True, log_prob_micro_batch_size_per_gpu=4)
    arr = ActorRolloutRefConfig(
        actor=actor_config(ppo_mini_batch_size=mini),
        rollout=rollout_config,
        ref=RefConfig(log_prob_micro_batch_size_per_gpu=4),
    )
    cfg, _ = worker_config(arr, n_workers=1, prompts=4)
    algorithm = dataclasses.replace(cfg.algorithm, use_kl_in_reward=in_reward)
    plan = make_plan(dataclasses.replace(cfg, algorithm=algorithm), 1)
    assert not plan.recompute_old_log_prob and plan.old_log_prob_from_rollout == from_rollout
    update = plan.flows[STEP_FLOW].phase("update_actor")
    assert ("old_log_probs" in update.reads) == from_rollout
    assert ("old_log_probs" in plan.flows[STEP_FLOW].phase("gen").writes) == from_rollout
