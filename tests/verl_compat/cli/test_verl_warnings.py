"""verl's keys of machinery ColoRL runs its own way load, and each set away from verl's default warns in one line,
only where nothing reads it: dynamic sampling's sampler, the trainer modes' keys, the vLLM engine's keys
(what the core does with the modes and the engine: tests/trainer/test_trainer_modes.py, tests/e2e/test_vllm_e2e.py)."""

from tests.trainer.test_trainer_modes import ONE_EACH, SEPARATE
from verl_compat.cli import load_config
from verl_compat.cli.inert import VLLM_KEYS, inert_warnings
from workers.compute.vllm_engine import ENGINE_KEYS

DEMO = ["trainer.n_gpus_per_node=2", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4"]
DEMO += ["actor_rollout_ref.rollout.n=2"]


def test_verls_asynchronous_sampler_key_is_accepted_and_warns():
    lines = inert_warnings(load_config([*DEMO, "algorithm.filter_groups.max_inflight_gen_batches=4"]))
    assert lines == [
        "algorithm.filter_groups.max_inflight_gen_batches=4: dynamic sampling generates one batch at a time; "
        "set algorithm.filter_groups.max_inflight_gen_batches=1 to silence this"
    ]


def test_the_sync_mode_and_a_separate_rollout_group_warn_nothing():
    assert inert_warnings(load_config(ONE_EACH)) == []
    # the rollout group's keys and the mode's are honoured, so no warning
    assert inert_warnings(load_config([*ONE_EACH, *SEPARATE])) == []


def test_keys_of_a_mode_not_chosen_warn():
    cfg = load_config(
        [*ONE_EACH, "trainer.v1.colocate_async.num_warmup_batches=2", "actor_rollout_ref.rollout.nnodes=1"]
    )
    lines = inert_warnings(cfg)
    assert any(line.startswith("trainer.v1.colocate_async.num_warmup_batches=2") for line in lines)
    assert any(line.startswith("actor_rollout_ref.rollout.nnodes=1") for line in lines)


def test_the_keys_the_engine_reads_warn_only_without_it():
    """Every vLLM key set away from verl's default: with rollout.name=hf each warns once, with vllm none does."""
    assert set(ENGINE_KEYS) <= set(VLLM_KEYS) and "gpu_memory_utilization" in VLLM_KEYS
    ro = "actor_rollout_ref.rollout"
    changed = [
        f"{ro}.tensor_model_parallel_size=4",
        f"{ro}.gpu_memory_utilization=0.3",
        f"{ro}.enforce_eager=true",
        f"{ro}.free_cache_engine=false",
        f"{ro}.max_num_batched_tokens=1024",
        f"{ro}.max_model_len=64",
        f"{ro}.max_num_seqs=8",
        f"{ro}.enable_chunked_prefill=false",
        f"{ro}.enable_prefix_caching=false",
        f"{ro}.load_format=auto",
        f"{ro}.layered_summon=true",
        f"+{ro}.engine_kwargs.vllm.block_size=32",
    ]
    warned = {line.split("=")[0] for line in inert_warnings(load_config([*changed, f"{ro}.name=hf"]))}
    assert warned == {key.split("=")[0].removeprefix("+") for key in changed}
    assert inert_warnings(load_config([*changed, f"{ro}.name=vllm"])) == []
