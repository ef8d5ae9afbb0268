"""benchmarks.tool_use runs end to end: a tiny model taught to call the calculator, tool_agent rows, one JSON object."""

from pathlib import Path

import pytest

from data.builtin import write_parquet
from tests.benchmarks.runner import run_benchmark
from tests.workers.agent_helpers import save_tool_calling_model

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # ~15 s (the agent loop itself: tests/workers/test_agent_loop.py, tests/e2e/test_multi_turn_e2e.py)
def test_tool_use_reports_accuracy_and_the_tool_call_rate(tmp_path):
    model = save_tool_calling_model(tmp_path / "model")
    rows = [
        {
            "data_source": "colorl/arith",
            "agent_name": "tool_agent",
            "prompt": [{"role": "user", "content": "1+2?"}],
            "reward_model": {"style": "rule", "ground_truth": "3"},
            "extra_info": {"index": i},
        }
        for i in range(3)
    ]
    write_parquet(rows, tmp_path / "test.parquet")
    out = run_benchmark(
        "tool_use",
        "--model",
        model,
        "--data",
        str(tmp_path / "test.parquet"),
        "--tool-config",
        str(REPO / "conf/tools/calculator.yaml"),
        "--limit",
        "3",
        "--response-length",
        "128",
        "--batch-size",
        "2",
        "--device",
        "cpu",
        "--show",
        "1",
        "--prompt-length",
        "64",
    )
    assert out["rows"] == 3 and out["accuracy"] == 1.0 and out["tool_call_rate"] == 1.0  # greedy: the taught call
    assert out["calls_per_problem"] == 1.0 and out["errors_per_problem"] == 0.0 and out["turns_per_problem"] == 4.0
    assert out["stop_reasons"] == {"answer": 3} and "<|tool|>3" in out["examples"][0]["conversation"]
