"""Multi-turn tool turns through the compiled decode step (``HFTurnSampler(compile_decode=True)``): greedy, fp32,
the same tokens, masks and log-probs as the HF loop, with tool turns fed as chunks and rows leaving through the
batch buckets; and (in process) a multi-turn run with ``rollout.compile_decode=true`` samples through it."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.workers.helpers import PAD, make_prompts
from workers.compute import decode, decode_loop
from workers.compute.rollout import generate_sequences
from workers.compute.turn_sampler import HFTurnSampler

B, P, R = 8, 6, 16
TOOL_TURN = [5, 6, 7]  # the ids of a tool turn, fed (not sampled)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@pytest.fixture
def steps(monkeypatch):
    """The compiled step with dynamo's eager backend (fast: the graphs are traced, not compiled), counted."""
    torch._dynamo.reset()
    compiled, calls = torch.compile(decode.decode_step, backend="eager", dynamic=False), []

    def step(*args):
        calls.append(args[0].shape[0])  # the bucket's rows
        return compiled(*args)

    monkeypatch.setitem(decode._COMPILED, "default", step)
    monkeypatch.setattr(decode_loop, "EOS_CHECK_INTERVAL", 2)
    return calls


def _episode(sampler, prompts, eos):
    """Odd rows end at their first turn's end; even rows get a tool turn after each of their first two."""
    turns: dict[int, int] = {}

    def end_turns(ended: dict[int, list[int]]) -> dict[int, list[int] | None]:
        answers = {}
        for row in ended:
            turns[row] = turns.get(row, 0) + 1
            answers[row] = TOOL_TURN if row % 2 == 0 and turns[row] < 3 else None
        return answers

    out = sampler(
        *prompts,
        response_length=R,
        eos_token_id=eos,
        pad_token_id=PAD,
        end_turns=end_turns,
        sampling=dict(do_sample=False),
        return_log_probs=True,
    )
    return out, turns


def test_tool_turns_through_the_compiled_step_give_the_hf_loops_tokens(model, steps):
    """Two prompts, four rows each, so every row's first turn ends at position 2 (after two compiled steps): the
    odd rows leave (bucket 8 -> 4) and the even rows' tool turns go in as one chunk through the HF forward, at the
    cache column after the step's."""
    prompts = [t.repeat_interleave(B // 2, dim=0) for t in make_prompts(2, P, seed=4)]
    free = generate_sequences(model, *prompts, response_length=R, eos_token_id=None, pad_token_id=PAD, do_sample=False)
    eos = sorted(set(free["responses"][:, 2].tolist()))
    hf, hf_turns = _episode(HFTurnSampler(model), prompts, eos)
    assert not steps  # the HF loop by default
    ours, our_turns = _episode(HFTurnSampler(model, compile_decode=True), prompts, eos)
    assert our_turns == hf_turns and set(hf_turns) == set(range(B))  # every row's first turn ended
    for key in ("responses", "model_mask", "valid", "finished"):
        assert torch.equal(getattr(ours, key), getattr(hf, key)), key
    torch.testing.assert_close(ours.log_probs, hf.log_probs, atol=1e-5, rtol=0)
    assert steps[:2] == [B, B] and set(steps) == {B, B // 2}  # buckets only, and the odd rows left
    assert int(hf.valid.sum() - hf.model_mask.sum()) >= B // 2 * len(TOOL_TURN)  # the fed tokens


def test_a_multi_turn_run_samples_its_tool_turns_with_the_compiled_step(steps, tmp_path, monkeypatch):
    """``rollout.compile_decode=true`` reaches the agent loop's sampler in the worker: two GRPO steps with tools (in
    process, one worker) decode through the step, at bucket sizes, and log the tool metrics."""
    from tests.e2e.test_multi_turn_e2e import fit, tool_config
    from tests.workers.agent_helpers import save_tool_calling_model

    monkeypatch.setenv("COLORL_PRELOAD", "verl_compat.tools")  # as main.py sets it: verl's tool class names
    extra = ("trainer.use_ray=false", "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.compile_decode=true")
    records = fit(tool_config(tmp_path, save_tool_calling_model(tmp_path / "model"), extra))
    assert [r["step"] for r in records] == [0, 1, 2]  # validation before training too
    assert steps and set(steps) <= set(decode.buckets(8)) | set(decode.buckets(2))  # 8 rows a step, 2 validated
    for record in records[1:]:
        assert record["tool_call_counts/mean"] > 0 and record["multi_turn/tokenization_mismatch_ratio"] == 0
