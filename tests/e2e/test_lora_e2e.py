"""LoRA through the trainer on 2 CPU workers: GRPO with a KL loss to the adapters-disabled reference, checkpoints
of adapters only, elastic resume on one worker, and an export of merged weights that loads without peft."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from transformers import AutoModelForCausalLM

from planner import load_config
from tests.e2e.test_checkpoint import run
from tests.e2e.test_ppo_e2e import read_jsonl
from workers.checkpoint.shards import PlainLoadPlanner, PlainReader

pytestmark = pytest.mark.timeout(300)


def config(tmp_path, steps: int, n_workers: int = 2, *extra: str):
    return load_config(
        [
            f"builtin.cache_dir={tmp_path.parent / 'assets'}",
            "builtin.hidden_size=32",
            "builtin.num_train=16",
            "builtin.num_val=4",
            "builtin.sft_warmup_steps=2",
            "data.train_batch_size=4",
            "data.max_response_length=5",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.model.lora_rank=8",
            "actor_rollout_ref.model.lora_alpha=16",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.optim.lr=1e-2",
            f"trainer.n_gpus_per_node={n_workers}",
            "trainer.device=cpu",
            f"trainer.total_training_steps={steps}",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            "trainer.save_freq=2",
            f"trainer.default_local_dir={tmp_path}",
            "trainer.logger=[file]",
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def lora_run(ray_cluster, tmp_path_factory):
    """2 steps on 2 workers (saved at step 2), then one more step resumed on 1 worker (saved at step 3)."""
    root = tmp_path_factory.mktemp("lora")
    run(config(root / "two", 2))
    shutil.copytree(root / "two" / "global_step_2", root / "one" / "global_step_2")
    resumed = run(config(root / "one", 3, n_workers=1))
    return root, resumed


@pytest.mark.parametrize("kl_loss_type", ["low_var_kl", pytest.param("full", marks=pytest.mark.slow)])  # full: ~16 s
def test_the_reference_is_the_base_model(lora_run, kl_loss_type, tmp_path):
    """low_var_kl: ref log-probs from the ref phase; full: reference logits inside the update, both sharded."""
    root, _ = lora_run
    run_dir = root / "two"
    if kl_loss_type == "full":
        run_dir = tmp_path / "full"
        run(config(run_dir, 2, 2, "actor_rollout_ref.actor.kl_loss_type=full", "trainer.save_freq=-1"))
    metrics = {r["step"]: r for r in read_jsonl(run_dir / "metrics.jsonl")}
    assert metrics[1]["actor/kl_loss"] == 0.0  # adapters start at zero, and one optimizer step per batch
    assert metrics[2]["actor/kl_loss"] > 0.0  # the policy moved; the reference (adapters disabled) did not


def model_shards(role_dir: Path) -> dict[str, torch.Tensor]:
    """The model tensors a role's sharded checkpoint holds, read in this process."""
    reader = PlainReader(role_dir)
    state = {
        k: torch.empty(tuple(v.size), dtype=v.properties.dtype)
        for k, v in reader.read_metadata().state_dict_metadata.items()
        if k.startswith("model.")
    }
    dcp.load(state, storage_reader=reader, planner=PlainLoadPlanner(), no_dist=True)
    return state


def test_checkpoints_hold_only_the_adapters(lora_run):
    root, _ = lora_run
    actor = root / "two" / "global_step_2" / "actor"
    shards = model_shards(actor)
    assert shards and all(".lora_A." in k or ".lora_B." in k for k in shards)  # no frozen base weight
    base_path = json.loads((actor / "adapter_config.json").read_text())["base_model_name_or_path"]
    base = AutoModelForCausalLM.from_pretrained(base_path)
    assert sum(v.numel() for v in shards.values()) < sum(p.numel() for p in base.parameters())


def test_elastic_resume_on_one_worker_trains_on(lora_run):
    root, resumed = lora_run
    assert resumed.global_step == 3 and [r["step"] for r in read_jsonl(root / "one" / "metrics.jsonl")] == [3]
    saved = model_shards(root / "two" / "global_step_2" / "actor")
    now = model_shards(root / "one" / "global_step_3" / "actor")
    assert saved.keys() == now.keys() and any(not torch.equal(saved[k], now[k]) for k in saved)


def test_export_writes_merged_weights_that_load_without_peft(lora_run, tmp_path):
    root, _ = lora_run
    actor = root / "one" / "global_step_3" / "actor"
    subprocess.run(
        [sys.executable, "-m", "trainer.export", str(root / "one"), "--out", str(tmp_path / "hf")],
        check=True,
        capture_output=True,
        cwd=Path(__file__).parents[2],
    )
    base_path = json.loads((actor / "adapter_config.json").read_text())["base_model_name_or_path"]
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").state_dict()
    base = AutoModelForCausalLM.from_pretrained(base_path).state_dict()
    assert merged.keys() == base.keys()  # plain HF weights: no adapter or base_layer keys left
    assert any(not torch.equal(merged[k], base[k]) for k in base)
    assert not list((tmp_path / "hf").glob("adapter_*"))
