"""The other benchmark scripts run end to end at tiny sizes and print one JSON object with the documented keys
(floor and step: test_floor_and_step.py)."""

import json
import subprocess

import pytest
import torch

from tests.benchmarks.runner import REPO, TINY, R, run_benchmark


@pytest.mark.slow  # ~14 s
def test_transfer_round_trips_a_dataproto_through_the_workers():
    out = run_benchmark("transfer", "--mb", "2", "--workers", "2", "--repeats", "2", timeout=120)
    assert out["workers"] == 2 and out["payload_mib"] == pytest.approx(2, rel=0.01)
    assert len(out["round_trip_s_all"]) == 2 and out["payload_gb_per_s"] > 0


@pytest.mark.slow  # two training steps per setting: ~27 s (what stays in the workers: test_dataflow.py, tests/e2e)
def test_transfer_counts_the_bytes_a_step_moves(cache_dir):
    """The demo's GRPO step on one worker: the prompts go out, the advantages follow; the responses, their masks
    and the attention mask come back; the rollout's sequences never travel again."""
    sets = [
        f"builtin.cache_dir={cache_dir}",
        "builtin.hidden_size=32",
        "builtin.num_layers=1",
        "builtin.sft_warmup_steps=0",
        "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "trainer.n_gpus_per_node=1",
    ]
    out = run_benchmark("transfer", "--per-step", "--steps", "1", *(arg for s in sets for arg in ("--set", s)))
    rows, p, r = 4, out["shapes"]["prompt_length"], out["shapes"]["response_length"]
    gen, update = out["by_call"]["generate_sequences"], out["by_call"]["update_actor"]
    assert set(out["by_call"]) == {"generate_sequences", "update_actor"}  # one on-policy step: no other phase
    assert gen["to_workers"] == rows * (3 * p + 1) * 8  # input_ids, attention_mask, position_ids + the row index
    assert gen["to_driver"] == rows * (p + r + 2 * r) * 8  # attention_mask, responses, response_mask
    assert update["to_workers"] == rows * (r * 4 + 8) and update["to_driver"] == 0  # advantages + the row index
    assert out["to_workers_bytes_per_step"] == gen["to_workers"] + update["to_workers"]


@pytest.mark.slow
def test_memory_compares_fsdp_ranks_with_one_process(cache_dir):
    out = run_benchmark(
        "memory",
        "--hidden",
        "32",
        "--layers",
        "2",
        "--prompts",
        "2",
        "--n",
        "2",
        "--device",
        "cpu",
        "--cache-dir",
        cache_dir,
    )
    ranks, plain = out["fsdp_2_ranks"], out["unsharded"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for row in [*ranks, plain]:
        assert 0 < row["rss_imported_mb"] <= row["peak_rss_compute_mb"] <= row["peak_rss_lifetime_mb"]
        phases = row["peak_by_phase_mb"]
        assert set(phases) == {"log_prob", "update_fwd_bwd", "optimizer_step"}
        assert max(phases.values()) <= row["peak_rss_compute_mb"] + 1  # samples never exceed the kernel's mark
        assert row["peak_tensor_mb"] > 0  # tensor bytes held at the peak, the CPU analogue of cuda max allocated
    expected_ratios = {"peak_rss_compute", "peak_compute_above_imports", "peak_tensor"}
    assert set(out["ratio_fsdp_rank_over_unsharded"]) >= expected_ratios


def test_memory_counts_tensor_bytes_held_and_the_allocation_peak():

    from benchmarks.memory import allocated_peak_bytes, storage_bytes

    mb = 2**20
    base = torch.zeros(mb // 4)  # 1 MiB of float32
    assert storage_bytes([base, base[:10], base.view(4, -1), None]) == mb  # views share one storage

    def run() -> None:
        big = torch.ones(4 * mb // 4)  # 4 MiB, freed before the 2 MiB one is made
        del big
        small = torch.ones(2 * mb // 4)
        del small

    assert 4 * mb <= allocated_peak_bytes(run) < 6 * mb


@pytest.mark.slow
@pytest.mark.parametrize("kl, lora", [(False, False), (True, False), (False, True)], ids=["plain", "kl", "lora"])
def test_trl_baseline_runs_in_its_own_venv(cache_dir, kl, lora):
    """Installs TRL into benchmarks/.trl-venv on first use (minutes), then runs two GRPO steps with ColoRL's settings
    (LoRA: peft adapters of the same rank on the same modules)."""
    adapters = ["--set", "actor_rollout_ref.model.lora_rank=4", "--set", "actor_rollout_ref.model.lora_alpha=8"]
    out = run_benchmark(
        "trl",
        *TINY,
        "--steps",
        "2",
        "--warmup",
        "1",
        "--threads",
        "1",
        "--cache-dir",
        cache_dir,
        "--set",
        "actor_rollout_ref.rollout.temperature=0.7",
        *(["--kl"] if kl else []),
        *(adapters if lora else []),
        timeout=1800,
    )
    assert out["versions"]["trl"] == "1.16.0"
    assert (out["beta"] > 0) == kl and out["ref_model"] == kl  # with --kl: ColoRL's kl_loss_coef and a ref model
    assert len(out["s_per_step_all"]) == 2 and out["s_per_step"] > 0 and out["gen_s"] > 0
    assert 1 <= out["completion_length_mean"] <= R and out["completion_tokens_per_s"] > 0
    assert out["settings"]["temperature"] == 0.7 and out["settings"]["learning_rate"] == 3e-4  # ColoRL's values
    assert (out["lora"] == {"r": 4, "lora_alpha": 8.0, "target_modules": "all-linear"}) == lora
    assert (out["trainable_params"] < 10_000) == lora  # only the adapters train


def test_compare_ratios_use_the_floor_that_applies():
    from benchmarks.compare import ratios

    row = {"floor": 0.1, "trl": 0.2, "colorl_w1": 0.11, "colorl_w2": 0.25}
    assert ratios(row, [1, 2]) == {
        "colorl_w1_over_floor": 1.1,
        "colorl_w1_over_trl": 0.55,
        "colorl_w2_over_floor": 2.5,
        "colorl_w2_over_trl": 1.25,
        "w2_over_w1": 2.273,
    }


def test_compare_best_ratios_take_each_contenders_fastest_round():
    from benchmarks.compare import best_ratios

    rows = [{"floor": 0.1, "trl": 0.3, "colorl_w1": 0.2}, {"floor": 0.2, "trl": 0.15, "colorl_w1": 0.12}]
    assert best_ratios(rows, [1]) == {"colorl_w1_over_floor": 1.2, "colorl_w1_over_trl": 0.8}


def test_compare_passes_switches_and_paths_to_every_benchmark():
    from benchmarks.compare import parse_args, shared_flags

    argv = ["--kl", "--model-path", "/m", "--sft-warmup-steps", "0", "--set", "trainer.seed=3"]
    flags = shared_flags(parse_args(argv))
    assert "--kl" in flags and flags[flags.index("--model-path") + 1] == "/m"
    assert flags[flags.index("--sft-warmup-steps") + 1] == "0"
    assert flags[-1] == "--set=trainer.seed=3"
    assert "--model-path" not in shared_flags(parse_args([]))  # unset: the built-in model
    assert "--kl" not in shared_flags(parse_args([]))


@pytest.mark.slow  # ~23 s (sharded checkpoints: tests/workers/test_checkpoint_shards.py)
def test_checkpoint_saves_and_loads_on_one_and_two_ranks():
    out = run_benchmark("checkpoint", "--hidden", "32", "--layers", "2", "--repeats", "1", "--world", "1", "2")
    assert [[r["rank"] for r in out["worlds"][w]] for w in ("1", "2")] == [[0], [0, 1]]
    assert all(r["save_s"] > 0 and r["load_s"] > 0 for ranks in out["worlds"].values() for r in ranks)


@pytest.mark.slow  # ~14 s
def test_tensordict_storage_compares_both_storages():
    run_benchmark("tensordict_storage", "--rows", "64", "--width", "16", "--repeats", "1")


@pytest.mark.slow  # training runs: ~27 s (the estimate: tests/trainer/test_memory_estimate.py)
def test_memory_estimate_compares_the_estimate_with_the_workers_peak(cache_dir):
    tiny = {
        "builtin.hidden_size": 32,
        "builtin.num_layers": 1,
        "builtin.sft_warmup_steps": 0,
        "builtin.cache_dir": cache_dir,
        "data.train_batch_size": 2,
        "actor_rollout_ref.rollout.n": 2,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "trainer.n_gpus_per_node": 1,
        "trainer.device": "cpu",
    }
    out = run_benchmark("memory_estimate", "--steps", "1", *[f"--set={k}={v}" for k, v in tiny.items()])
    assert out["workers"] == 1 and out["measured"] == "perf/cpu_memory_peak_gb"
    assert 0.2 < out["measured_peak_gib_per_worker"] < 2
    for name in ("at_max_lengths", "at_observed_lengths"):
        estimate = out[name]
        assert estimate["peak_phase"] in estimate["phases"] and {"load", "gen", "update_actor"} <= set(
            estimate["phases"]
        )
        assert estimate["measured_over_estimate"] == pytest.approx(
            out["measured_peak_gib_per_worker"] / estimate["peak_gib"], rel=0.01
        )
    assert 1 <= out["observed_lengths"]["response"] <= 8


def test_against_runs_the_same_command_in_another_checkout(tmp_path):
    """benchmarks.against: a detached worktree of a commit, the command in each tree, head / ref ratios."""

    ref_dir = tmp_path / "ref"
    try:
        # a command that prints its tree's path as a number of characters: the two trees differ
        out = run_benchmark(
            "against",
            "--ref",
            "HEAD",
            "--ref-dir",
            str(ref_dir),
            "--rounds",
            "2",
            "--",
            "python",
            "-c",
            "import json, os; print(json.dumps({'cwd_chars': len(os.getcwd()), 'one': 1}))",
        )
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(ref_dir)], cwd=REPO, capture_output=True)
    assert len(out["rounds"]) == 2 and out["rounds"][0]["ref"]["cwd_chars"] == len(str(ref_dir))
    assert out["rounds"][0]["head"]["cwd_chars"] == len(str(REPO)) and out["median_head_over_ref"]["one"] == 1.0


def test_against_reads_a_training_run_after_its_warmup(tmp_path):
    from benchmarks.against import step_figures, summarize

    rows = [
        {"step": 1, "timing_s/step": 9.0, "perf/cpu_memory_peak_gb": 1.0},
        {"step": 2, "timing_s/step": 2.0, "timing_s/gen": 1.0, "perf/cpu_memory_peak_gb": 1.5},
        {"step": 3, "timing_s/step": 4.0, "timing_s/gen": 3.0, "perf/cpu_memory_peak_gb": 1.2},
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    figures = step_figures(tmp_path / "metrics.jsonl", warmup=1)
    assert figures == {"timing_s/step": 3.0, "timing_s/gen": 2.0, "perf/cpu_memory_peak_gb": 1.5, "steps_measured": 2}
    half = {k: v / 2 for k, v in figures.items()}
    assert summarize([{"ref": figures, "head": half}])["median_head_over_ref"]["timing_s/step"] == 0.5


def test_learning_race_times_the_gain_from_the_first_validation():
    from benchmarks.learning_race import first_gain

    curve = [{"minute": 1.0, "strict": 0.3}, {"minute": 9.0, "strict": 0.55}, {"minute": 14.5, "strict": 0.6}]
    assert first_gain(curve, 0.30) == 14.5 and first_gain(curve, 0.2) == 9.0 and first_gain(curve, 0.5) is None


@pytest.mark.slow  # ~23 s
def test_allocator_runs_the_presets_update_under_each_allocator(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(
        LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=500)
    ).save_pretrained(tmp_path)
    out = run_benchmark(
        "allocator",
        "--iterations",
        "2",
        "--allocator",
        "mimalloc",
        "glibc-kept",
        "--set",
        f"actor_rollout_ref.model.path={tmp_path}",
    )
    results = out["results"]
    assert [results[name]["mimalloc"] for name in ("mimalloc", "glibc-kept")] == [True, False]
    for result in results.values():
        assert 0 < result["rss_loaded_gib"] <= result["peak_rss_gib"] and len(result["s_all"]) == 2


def test_remove_padding_compares_packed_and_shared_prompt_variants_with_the_padded_path():
    out = run_benchmark(
        "remove_padding",
        "--rows",
        "8",
        "--prompt-length",
        "8",
        "--response-length",
        "6",
        "--hidden",
        "64",
        "--layers",
        "1",
        "--micro",
        "4",
        "--n",
        "4",
        "--repeats",
        "1",
    )
    variants = out["variants"]
    assert set(variants) >= {"padded", "remove_padding", "remove_padding+prefix_grouper"}
    assert all(v["log_prob_max_abs_diff"] < 1e-4 for v in variants.values())  # the same log-probs, every layout


@pytest.mark.slow  # two trainer runs on 2 workers: ~1 min
def test_balance_compares_the_same_steps_with_and_without_reordering(cache_dir):
    out = run_benchmark(
        "balance", *TINY, "--workers", "2", "--steps", "1", "--warmup", "0", "--cache-dir", cache_dir, timeout=400
    )
    assert out["off"]["global_seqlen"] == {}  # no reordering, no metrics
    seqlen = out["on"]["global_seqlen"]
    assert seqlen["balanced_max"] <= seqlen["max"] and seqlen["balanced_min"] >= seqlen["min"]
    assert "balance" in out["on"]["timing_s"] and out["speedup"] > 0
