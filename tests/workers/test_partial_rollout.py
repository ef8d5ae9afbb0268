"""Partial rollouts' pieces (trainer.asynchronous.partial, workers.compute.decode_loop.Partial) on a tiny model: a
response generated in pieces, each continuing the rows from their tokens so far, is the response generated whole; a
piece stops at its quota of ended groups, waits for the rows it must end, and gives no row more than its budget."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.workers.helpers import PAD, make_prompts
from trainer.asynchronous.partial import ENDED, FIRST, LAST, LENGTH, LOG_PROBS, TOKENS, append, continuation
from workers.compute.decode_loop import EOS_CHECK_INTERVAL, Partial
from workers.compute.rollout import generate_sequences

N, P, R = 2, 6, 24  # rows per prompt group, prompt width, response_length


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@pytest.fixture(scope="module")
def prompts():
    """Three prompt groups of N identical rows (greedy: their responses are the same)."""
    return tuple(t.repeat_interleave(N, dim=0) for t in make_prompts(3, P, seed=3))


def _generate(model, ids, mask, pos, eos, partial=None):
    kwargs = dict(response_length=R, eos_token_id=eos, pad_token_id=PAD, do_sample=False, return_log_probs=True)
    return generate_sequences(model, ids, mask, pos, partial=partial, **kwargs)


def _eos_ending_group_0_early(model, prompts):
    """An EOS token that group 0 emits early (its third token): it ends at the first check, the others later."""
    free = _generate(model, *prompts, eos=None)["responses"]
    return int(free[0, 2])


def test_a_response_in_pieces_is_the_response_generated_whole(model, prompts):
    eos = _eos_ending_group_0_early(model, prompts)
    whole = _generate(model, *prompts, eos=eos)
    rows = len(prompts[0])
    state = {
        TOKENS: torch.full((rows, R), PAD),
        LOG_PROBS: torch.zeros(rows, R),
        LENGTH: torch.zeros(rows, dtype=torch.long),
        ENDED: torch.zeros(rows, dtype=torch.bool),
        FIRST: torch.zeros(rows, dtype=torch.long),
        LAST: torch.zeros(rows, dtype=torch.long),
    }
    group = torch.arange(rows) // N
    for version, quota in enumerate((1, rows)):  # a piece that stops at one ended group, then one to the end
        index = (~state[ENDED]).nonzero().flatten()
        prompt = tuple(t[index] for t in prompts)
        ids, mask, pos = continuation(prompt, state[TOKENS][index], state[LENGTH][index])
        budget = R - state[LENGTH][index]
        required = torch.zeros(len(index), dtype=torch.bool)
        out = _generate(model, ids, mask, pos, eos, Partial(budget, group[index], quota, required))
        append(state, index, out, version)
        if version == 0:
            assert state[ENDED][:N].all() and not state[ENDED].all()  # group 0 ended; the piece stopped early
            assert (state[LENGTH][~state[ENDED]] == EOS_CHECK_INTERVAL).all()
    assert state[ENDED].all()
    assert ((state[FIRST] == 0) & (state[LAST] == 1)).any()  # some rows were generated in both pieces
    assert torch.equal(state[LENGTH], whole["response_mask"].sum(-1))
    assert torch.equal(state[TOKENS], whole["responses"])
    torch.testing.assert_close(state[LOG_PROBS], whole["rollout_log_probs"], atol=1e-5, rtol=1e-5)


def test_a_piece_waits_for_its_required_rows_and_keeps_to_each_budget(model, prompts):
    rows = len(prompts[0])
    group = torch.arange(rows) // N
    budget = torch.tensor([3, 3, R, R, R, R])
    stop_at_once = Partial(budget, group, quota=0, required=torch.zeros(rows, dtype=torch.bool))
    out = _generate(model, *prompts, eos=None, partial=stop_at_once)
    lengths = out["response_mask"].sum(-1)
    assert lengths.tolist() == [3, 3] + [EOS_CHECK_INTERVAL] * 4  # budgets, then the first check stops it
    assert out["ended"].tolist() == [True, True, False, False, False, False]
    required = torch.tensor([False, False, True, False, False, False])
    waiting = _generate(model, *prompts, eos=None, partial=Partial(budget, group, 0, required))
    assert waiting["response_mask"].sum(-1).tolist() == [3, 3, R, R, R, R]  # row 2 runs to its budget (its twin too)
    assert waiting["ended"].all()


def test_a_continuation_is_left_padded_with_positions_going_on():
    ids, mask, pos = make_prompts(2, P, seed=1)
    tokens = torch.tensor([[7, 8, 9, PAD], [5, PAD, PAD, PAD]])
    c_ids, c_mask, c_pos = continuation((ids, mask, pos), tokens, torch.tensor([3, 1]))
    assert c_ids.shape[1] == int(mask.sum(-1).max()) + 3  # as wide as the longest row
    for row, (n, new) in enumerate(((3, [7, 8, 9]), (1, [5]))):
        valid = c_mask[row].bool()
        assert valid.tolist() == sorted(valid.tolist())  # left padding
        assert c_ids[row, valid].tolist() == ids[row, mask[row].bool()].tolist() + new
        last = int(pos[row, -1])
        assert c_pos[row, valid][-n:].tolist() == list(range(last + 1, last + 1 + n))
