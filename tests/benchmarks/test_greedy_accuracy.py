"""benchmarks.greedy_accuracy runs end to end on a tiny model and arithmetic problems and prints one JSON object."""

from data.preprocess.arith import make_splits, write_splits
from tests.benchmarks.runner import run_benchmark
from tests.data.gsm8k_fixture import printable_tokenizer, save_tiny_model


def test_greedy_accuracy_scores_every_row(tmp_path):
    model = save_tiny_model(tmp_path / "model", printable_tokenizer())
    data = write_splits(make_splits({"test": 5}, seed=0), tmp_path / "arith")["test"]
    out = run_benchmark(
        "greedy_accuracy",
        "--model",
        model,
        "--data",
        str(data),
        "--limit",
        "5",
        "--max-new-tokens",
        "4",
        "--batch-size",
        "2",
        "--device",
        "cpu",
        "--show",
        "2",
    )
    assert out["rows"] == 5 and 0.0 <= out["accuracy"] <= 1.0 and 0.0 <= out["flexible"] <= 1.0
    assert out["s_per_batch"] > 0 and len(out["examples"]) == 2
    assert out["examples"][0]["truth"] == make_splits({"test": 5}, seed=0)["test"][0]["reward_model"]["ground_truth"]
