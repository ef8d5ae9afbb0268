"""Hand-worked batches for trainer.observing.metrics."""

import time

import pytest
import torch

from trainer.observing import metrics as tm

torch.set_num_threads(1)


def _batch() -> dict[str, torch.Tensor]:
    """Two samples, prompt width 3 (left padded), response width 3 (right padded).

    Sample 0: prompt 2 tokens, response 3 tokens (hits the max); sample 1: prompt 3 tokens (max), response 1.
    """
    response_mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    prompt_mask = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    return {
        "responses": torch.tensor([[5, 6, 7], [8, 0, 0]]),
        "response_mask": response_mask,
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=-1),
        "token_level_scores": torch.tensor([[0.0, 0.0, 1.0], [3.0, 0.0, 0.0]]),
        "token_level_rewards": torch.tensor([[0.0, -0.5, 1.0], [2.0, 0.0, 0.0]]),
        "advantages": torch.tensor([[1.0, 2.0, 3.0], [-4.0, 99.0, 99.0]]),
        "returns": torch.tensor([[1.0, 2.0, 3.0], [4.0, 99.0, 99.0]]),
        "values": torch.tensor([[1.0, 2.0, 3.0], [2.0, -99.0, -99.0]]),
    }


def test_data_metrics_without_critic():
    m = tm.compute_data_metrics(_batch(), use_critic=False)
    expected = {
        "critic/score/mean": 2.0, "critic/score/max": 3.0, "critic/score/min": 1.0,
        "critic/rewards/mean": 1.25, "critic/rewards/max": 2.0, "critic/rewards/min": 0.5,
        "critic/advantages/mean": 0.5, "critic/advantages/max": 3.0, "critic/advantages/min": -4.0,
        "critic/returns/mean": 2.5, "critic/returns/max": 4.0, "critic/returns/min": 1.0,
        "response_length/mean": 2.0, "response_length/max": 3.0, "response_length/min": 1.0,
        "response_length/clip_ratio": 0.5,
        "prompt_length/mean": 2.5, "prompt_length/max": 3.0, "prompt_length/min": 2.0,
        "prompt_length/clip_ratio": 0.5,
    }  # fmt: skip
    assert m == pytest.approx(expected)
    assert all(isinstance(v, float) for v in m.values())


def test_data_metrics_with_critic():
    m = tm.compute_data_metrics(_batch(), use_critic=True)
    assert m["critic/values/mean"] == pytest.approx(2.0)
    assert m["critic/values/min"] == 1.0 and m["critic/values/max"] == 3.0
    # valid returns [1,2,3,4] (var 5/3), returns − values [0,0,0,2] (var 1): 1 − 1/(5/3) = 0.4
    assert m["critic/vf_explained_var"] == pytest.approx(0.4, abs=1e-4)
    perfect = _batch()
    perfect["values"] = perfect["returns"].clone()
    assert tm.compute_data_metrics(perfect, use_critic=True)["critic/vf_explained_var"] == pytest.approx(1.0)


def test_timing_metrics():
    timing = {"gen": 0.4, "update_actor": 1.0, "reward": 0.1, "step": 2.0}
    m = tm.compute_timing_metrics(_batch(), timing)
    assert {k: m[k] for k in m if k.startswith("timing_s/")} == {f"timing_s/{k}": v for k, v in timing.items()}
    assert m["timing_per_token_ms/gen"] == pytest.approx(400 / 4)  # 4 response tokens
    assert m["timing_per_token_ms/update_actor"] == pytest.approx(1000 / 9)  # 5 prompt + 4 response tokens
    assert "timing_per_token_ms/reward" not in m and "timing_per_token_ms/step" not in m


def test_throughput_metrics():
    m = tm.compute_throughput_metrics(_batch(), {"step": 3.0}, n_workers=2)
    assert m == pytest.approx({"perf/total_num_tokens": 9.0, "perf/time_per_step": 3.0, "perf/throughput": 1.5})


def test_reduce_metrics():
    reduced = tm.reduce_metrics({"a": [1.0, 2.0, 6.0], "b": 4, "c": [torch.tensor(1.0), torch.tensor(0.0)]})
    assert reduced == {"a": 3.0, "b": 4.0, "c": 0.5}
    extremes = {"distillation/loss_min": [0.5, 0.25], "distillation/teacher_mass_max": [0.5, 0.75]}
    assert tm.reduce_metrics(extremes) == {"distillation/loss_min": 0.25, "distillation/teacher_mass_max": 0.75}


def test_timed_accumulates_and_survives_exceptions():
    timing: dict[str, float] = {}
    with tm.timed("gen", timing) as timer:
        time.sleep(0.01)
    assert timing["gen"] == timer.elapsed >= 0.01
    with pytest.raises(RuntimeError), tm.timed("gen", timing):
        time.sleep(0.01)
        raise RuntimeError("boom")
    assert timing["gen"] >= 0.02
    with tm.Timer() as t:
        pass
    assert 0.0 <= t.elapsed < 1.0


def test_a_tool_turn_counts_in_the_response_length_but_not_in_the_trained_tokens():
    batch = _batch()
    batch["response_mask"] = batch["response_mask"].clone()
    batch["response_mask"][0, 1] = 0  # sample 0's middle token is a tool token: attended, not trained
    m = tm.compute_data_metrics(batch, use_critic=False)
    assert (m["response_length/max"], m["response_length/clip_ratio"]) == (3.0, 0.5)  # the attended tokens


def test_multi_turn_metrics_have_verls_names_and_tool_rates():
    import numpy as np

    def column(values):
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out

    rows = {
        "__num_turns__": column([2, 4, 6, 4]),
        "tool_call_counts": column([0, 1, 3, 1]),
        "tool_error_counts": column([0, 0, 1, 1]),
        "tool_response_tokens": column([0, 10, 30, 12]),
        "tool_rewards": column([0.0, 0.5, -0.1, 0.0]),
        "tokenization_mismatch": column([False, False, True, False]),
        "stop_reason": column(["answer", "answer", "turn_limit", "length_limit"]),
    }
    m = tm.multi_turn_metrics(rows)
    assert (m["num_turns/mean"], m["num_turns/min"], m["num_turns/max"]) == (4.0, 2.0, 6.0)
    assert (m["tool_call_counts/mean"], m["tool_call_counts/max"]) == (1.25, 3.0)
    assert m["multi_turn/tool_success_rate"] == pytest.approx(0.6) and m["multi_turn/tool_errors/mean"] == 0.5
    assert (m["multi_turn/turn_limit_ratio"], m["multi_turn/length_limit_ratio"]) == (0.25, 0.25)
    assert m["multi_turn/tool_response_tokens/mean"] == 13.0 and m["multi_turn/tokenization_mismatch_ratio"] == 0.25
    assert tm.multi_turn_metrics({}) == {}
