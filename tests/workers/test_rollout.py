"""Rollout: output layout, EOS handling, sampling filters, and greedy equality with HF ``generate``."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.workers.helpers import PAD, VOCAB, make_prompts
from workers.rollout import filter_logits, generate_sequences, sample_next_token

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
        model, input_ids, attention_mask, position_ids, response_length=R, eos_token_id=None, pad_token_id=PAD,
        do_sample=False,
    )["responses"]
    eos = int(ours[0, 3])  # stops row 0 (and maybe others) early in the run below
    ours = generate_sequences(
        model, input_ids, attention_mask, position_ids, response_length=R, eos_token_id=eos, pad_token_id=PAD,
        temperature=0.0,
    )["responses"]
    hf = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=R, do_sample=False,
        eos_token_id=eos, pad_token_id=PAD,
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
        input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=R, do_sample=False,
        eos_token_id=eos, pad_token_id=PAD,
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
