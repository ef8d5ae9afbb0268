"""The rollout loops on ``meta``: prefill (one per distinct prompt, packed or left-padded), decoding with the
static cache, sampling (temperature, top-k, top-p), end-of-sequence handling, ended rows leaving the batch,
rollout log-probs, and the multi-turn sampler's tool turns. The prompts arrive on the host, as a worker's batch
does. The only host reads are ``algos.host_sync``'s; a ``meta`` batch reads as half its rows live at each check
(``rollout.live_rows``) and as every sampled token ending its turn (``turn_sampler.ended_turns``), so the row
dropping and the tool turns run. The agent loop around the sampler copies its result to the host once per
rollout (``AgentLoop``: tokens go to the tool parser and the trajectory); it is not run here."""

from __future__ import annotations

import pytest
import torch

from algos.host_sync import READS
from tests.fake_cuda.standin import StandinLM
from tests.workers.helpers import EOS, PAD, make_prompts
from workers.compute import decode_loop
from workers.compute.rollout import generate_sequences
from workers.compute.turn_sampler import HFTurnSampler

pytestmark = pytest.mark.fake_cuda

META = torch.device("meta")
B, P, R = 8, 6, 20


def _model(attention: str = "sdpa") -> torch.nn.Module:
    with META:
        model = StandinLM()
    model.config._attn_implementation = attention  # flash: the prompts prefill left-padded, not packed
    return model


def _prompts():
    ids, mask, positions = make_prompts(B, P)
    for x in (ids, mask, positions):  # rows 4..7 repeat rows 0..3: one prefill each
        x[4:] = x[:4]
    return ids, mask, positions


@pytest.mark.parametrize("attention", ["sdpa", "flash_attention_2"], ids=["packed_prefill", "padded_prefill"])
@pytest.mark.parametrize(
    "sampling",
    [dict(do_sample=False), dict(temperature=0.7, top_k=5, top_p=0.9)],
    ids=["greedy", "sampled"],
)
def test_generate_sequences_on_meta(attention, sampling):
    before = READS["rollout.live_rows"]
    out = generate_sequences(
        _model(attention),
        *_prompts(),
        response_length=R,
        eos_token_id=[EOS, 3],
        pad_token_id=PAD,
        return_log_probs=True,
        **sampling,
    )
    shapes = {"responses": (B, R), "input_ids": (B, P + R), "attention_mask": (B, P + R), "response_mask": (B, R)}
    shapes.update(position_ids=(B, P + R), rollout_log_probs=(B, R))
    assert {k: (v.device, tuple(v.shape)) for k, v in out.items()} == {k: (META, s) for k, s in shapes.items()}
    # one read per EOS_CHECK_INTERVAL tokens at most (here: 8 -> 4 -> 2 live rows, then none)
    assert 0 < READS["rollout.live_rows"] - before <= R // decode_loop.EOS_CHECK_INTERVAL


def test_a_partial_rollouts_piece_on_meta():
    """A piece of a partial rollout (trainer.asynchronous.partial): per-row budgets, the quota of ended groups and the
    rows it must end are counted on the device and read with the live rows, in the same one read per check."""
    before = READS["rollout.live_rows"]
    group, budget = torch.arange(B) // 2, torch.full((B,), R)
    piece = decode_loop.Partial(budget, group, quota=2, required=torch.zeros(B, dtype=torch.bool))
    out = generate_sequences(
        _model(), *_prompts(), response_length=R, eos_token_id=EOS, pad_token_id=PAD, partial=piece
    )
    assert (out["ended"].device, tuple(out["ended"].shape)) == (META, (B,))
    assert 0 < READS["rollout.live_rows"] - before <= R // decode_loop.EOS_CHECK_INTERVAL


def test_turn_sampler_tool_turns_on_meta():
    """Every other row gets a tool turn (fed in one chunk, as all live rows are forced at once), then finishes;
    the rows that finish leave the batch; every position costs one read (``turn_sampler.ended_turns``)."""
    calls: dict[int, int] = {}

    def end_turns(turns: dict[int, list[int]]) -> dict[int, list[int] | None]:
        answers = {}
        for row in turns:
            calls[row] = calls.get(row, 0) + 1
            answers[row] = [5, 6, 7] if row % 2 == 0 and calls[row] == 1 else None
        return answers

    before = READS["turn_sampler.ended_turns"]
    out = HFTurnSampler(_model())(
        *_prompts(),
        response_length=R,
        eos_token_id=[EOS],
        pad_token_id=PAD,
        end_turns=end_turns,
        sampling=dict(temperature=1.0),
        return_log_probs=True,
    )
    assert all(v.device == META for v in vars(out).values())
    assert calls == {row: 2 if row % 2 == 0 else 1 for row in range(B)}
    # two reads: at position 0 (every row ends its turn), then at 4 (after the tool turn, fed as one chunk)
    assert READS["turn_sampler.ended_turns"] - before == 2


def test_the_decode_step_through_its_buckets_on_meta():
    """``rollout.compile_decode``'s step (``workers.compute.decode``, eager here: meta has no kernels to compile)
    over a real Llama's weights on meta: the static cache, rows compacted to smaller buckets as half leave at each
    check, the outputs on the device, one host read per check at most."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from workers.compute import decode

    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    with META:
        model = LlamaForCausalLM(config)
    assert decode.supports(model)
    before = READS["rollout.live_rows"]
    out = decode.generate(
        model, *_prompts(), compiled=False, response_length=R, eos_token_id=EOS, pad_token_id=PAD,
        do_sample=False, return_log_probs=True,
    )  # fmt: skip
    assert {k: (v.device, tuple(v.shape[1:])) for k, v in out.items() if k in ("responses", "rollout_log_probs")} == {
        "responses": (META, (R,)),
        "rollout_log_probs": (META, (R,)),
    }
    assert 0 < READS["rollout.live_rows"] - before <= R // decode_loop.EOS_CHECK_INTERVAL


def test_the_decode_step_captures_cuda_graphs_on_cuda():
    """On CUDA each bucket's compiled graph is captured as a CUDA graph (``reduce-overhead``), on a CPU not; the
    two are separate compiled functions (a process may hold both)."""
    from workers.compute import decode

    assert decode.compile_mode(torch.device("cuda", 0)) == "reduce-overhead"
    assert decode.compile_mode(torch.device("cpu")) == decode.compile_mode(META) == "default"
    assert decode.compiled_step(torch.device("cuda", 0)) is not decode.compiled_step(torch.device("cpu"))
