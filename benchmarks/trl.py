"""Peer baseline: TRL's ``GRPOTrainer`` on the same model, prompts, reward, step shape and settings as ColoRL.

    python -m benchmarks.trl [--hidden 128 --layers 2 | --model-path DIR] [--prompts 16 --n 8]
                             [--response-length 8] [--threads N] [--steps 20 --warmup 3] [--device cpu|cuda]
                             [--set KEY=VALUE ...]

TRL is installed into its own venv, ``benchmarks/.trl-venv`` (made on first use with ``python3 -m venv``:
torch first, then trl, peft and the transformers version ColoRL uses); ColoRL never imports it. This process
builds ColoRL's config for the flags (``benchmarks.common.load_bench_config``, ``--set`` included), maps it to
``GRPOConfig`` (``grpo_settings``) and runs ``benchmarks/trl_grpo.py`` with the venv's python on the same train
file (``data.train_files``, else the built-in task's) and ColoRL's reward function for it. The same: prompts per
step and ``n``, response length, sampling temperature / top-p / top-k, learning rate and warm-up, AdamW's betas and
weight decay, gradient clipping, the clip range, optimizer steps per batch (``ppo_mini_batch_size``), the loss
aggregation (token-mean = DAPO), GRPO's std scaling, LoRA (``lora_rank`` > 0: peft adapters of the same rank, alpha
and target modules, as ColoRL's workers add them), precision (``bf16`` where ColoRL's actor computes in bf16;
TRL's bf16 is autocast over fp32 weights) and compilation (``torch_compile`` iff ``actor.compile_model``).
The KL: beta = 0 unless ``--kl`` (then ColoRL's ``kl_loss_coef``, and TRL's KL term is k3, ColoRL's default
``low_var_kl``). No gradient checkpointing.

Prints JSON: median s/step, median time inside ``generate``, completion tokens/s and the inner process's peak RSS
(``trl_grpo.py``), and the settings TRL ran with.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import add_batch_args, add_model_args, emit, machine, stdout_to_stderr

VENV = Path(__file__).resolve().parent / ".trl-venv"
INNER = Path(__file__).resolve().parent / "trl_grpo.py"
REPO = Path(__file__).resolve().parent.parent
TORCH = "torch==2.13.0"  # first and pinned: on CPU machines it resolves to the local CPU wheel
PACKAGES = ["trl==1.16.0", "transformers==5.23.0", "peft==0.21.2"]
MARK = "[trl_grpo] "  # trl_grpo.py's result lines
LOSS_TYPES = {"token-mean": "dapo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum-norm": "dr_grpo"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(parser)
    add_batch_args(parser)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (CPU)")
    args = parser.parse_args(argv)
    if args.algo != "grpo":
        parser.error("the TRL baseline is GRPOTrainer: --algo grpo only")
    return args


def grpo_settings(cfg: Any, device: str, kl: bool, steps: int, output_dir: str) -> dict[str, Any]:
    """``GRPOConfig`` arguments and the peft ``LoraConfig`` arguments (or None) that do what ColoRL's ``cfg`` does:
    the same batch, sampling, optimizer, loss and precision (see the module docstring)."""
    import torch

    from workers.parallel import fsdp

    arr, data = cfg.actor_rollout_ref, cfg.data
    actor, rollout, model, optim = arr.actor, arr.rollout, arr.model, arr.actor.optim
    _check_trl_has(actor, kl)
    mini_batches = data.train_batch_size // actor.ppo_mini_batch_size  # optimizer steps per batch and epoch
    bf16 = fsdp.compute_dtype(torch.device(device), actor.fsdp_config.mixed_precision) == torch.bfloat16
    warmup = optim.lr_warmup_steps if optim.lr_warmup_steps >= 0 else 0  # ColoRL counts batches, TRL steps
    clip_low = actor.clip_ratio if actor.clip_ratio_low is None else actor.clip_ratio_low
    clip_high = actor.clip_ratio if actor.clip_ratio_high is None else actor.clip_ratio_high
    grpo = dict(
        output_dir=output_dir,
        per_device_train_batch_size=actor.ppo_mini_batch_size * rollout.n,
        steps_per_generation=mini_batches,
        num_generations=rollout.n,
        gradient_accumulation_steps=1,
        num_iterations=actor.ppo_epochs,
        max_completion_length=int(rollout.response_length),
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=max(rollout.top_k, 0),
        learning_rate=optim.lr,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=warmup * mini_batches,
        adam_beta1=optim.betas[0],
        adam_beta2=optim.betas[1],
        weight_decay=optim.weight_decay,
        max_grad_norm=actor.grad_clip,
        beta=float(actor.kl_loss_coef) if kl else 0.0,
        epsilon=clip_low,
        epsilon_high=clip_high,
        loss_type=LOSS_TYPES[actor.loss_agg_mode],
        scale_rewards="group" if cfg.algorithm.norm_adv_by_std_in_grpo else "none",
        use_cpu=device == "cpu",
        bf16=bf16,
        torch_compile=bool(actor.compile_model),
        gradient_checkpointing=False,
        disable_dropout=True,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        max_steps=steps,
        seed=cfg.trainer.seed,
    )
    return {"grpo": grpo, "lora": _lora_settings(model)}


def _check_trl_has(actor: Any, kl: bool) -> None:
    """Exit where the actor's KL (with ``kl``) or loss aggregation has no TRL equivalent."""
    if kl and actor.kl_loss_type not in ("low_var_kl", "k3"):
        raise SystemExit(
            f"benchmarks.trl --kl: TRL's KL is k3; actor_rollout_ref.actor.kl_loss_type="
            f"{actor.kl_loss_type!r} has no TRL equivalent (use low_var_kl or k3)"
        )
    if actor.loss_agg_mode not in LOSS_TYPES:
        raise SystemExit(f"benchmarks.trl: actor.loss_agg_mode={actor.loss_agg_mode!r} has no TRL loss type")


def _lora_settings(model: Any) -> dict[str, Any] | None:
    """peft ``LoraConfig`` arguments for the model's adapters; None without them (``lora_rank`` 0)."""
    if not model.lora_rank:
        return None
    targets = model.target_modules
    return {
        "r": int(model.lora_rank),
        "lora_alpha": float(model.lora_alpha),
        "target_modules": targets if isinstance(targets, str) else list(targets),
    }


def run_trl(
    settings: dict[str, Any], model_path: str, train_file: str, threads: int, warmup: int, **race: Any
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run ``trl_grpo.py`` in TRL's venv; (its evaluation lines, its summary). ``race``: eval, launch_time,
    minutes (``benchmarks.learning_race``)."""
    inner = {
        **settings,
        "model_path": model_path,
        "train_file": train_file,
        "threads": threads,
        "warmup": warmup,
        **race,
    }
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}  # for data.tasks
    # -P: benchmarks/ (where trl.py lives) stays off sys.path, so `import trl` is TRL
    process = subprocess.Popen(
        [str(venv_python()), "-P", str(INNER), json.dumps(inner)],
        stdout=subprocess.PIPE,
        stderr=sys.stderr,
        text=True,
        env=env,
    )
    lines = [json.loads(line.removeprefix(MARK)) for line in process.stdout if line.startswith(MARK)]
    if process.wait() != 0:
        sys.exit(f"benchmarks.trl: the TRL run failed (exit {process.returncode}); its traceback is above")
    return [line["eval"] for line in lines if "eval" in line], lines[-1]


def venv_python() -> Path:
    """The TRL venv's python, creating the venv and installing into it the first time (or when pins change)."""
    python = VENV / "bin" / "python"
    stamp = VENV / f".installed-{hashlib.sha1(' '.join([TORCH, *PACKAGES]).encode()).hexdigest()[:10]}"
    if stamp.exists():
        return python
    print(f"[trl] creating {VENV} and installing {TORCH} {' '.join(PACKAGES)}", file=sys.stderr, flush=True)
    steps = [
        [sys.executable, "-m", "venv", str(VENV)],
        [str(python), "-m", "pip", "install", "-q", TORCH],
        [str(python), "-m", "pip", "install", "-q", *PACKAGES],
    ]
    for command in steps:
        result = subprocess.run(command, stdout=sys.stderr, stderr=sys.stderr)
        if result.returncode != 0:
            sys.exit(
                f"benchmarks.trl: could not set up the TRL venv: `{' '.join(command)}` exited with "
                f"{result.returncode} (see pip's message above); delete {VENV} to start over"
            )
    stamp.touch()
    return python


def main(argv: list[str] | None = None) -> None:
    from benchmarks.common import load_bench_config
    from trainer.running.build import build_trainer

    args = parse_args(argv)
    venv_python()
    with tempfile.TemporaryDirectory(prefix="colorl-bench-trl-") as tmp:
        with stdout_to_stderr():  # the built-in assets and the data's paths, as benchmarks.step has them
            cfg = build_trainer(load_bench_config(args, 1, tmp)).config
        settings = grpo_settings(cfg, args.device, args.kl, args.warmup + args.steps, str(Path(tmp) / "out"))
        train_files = cfg.data.train_files
        train_file = train_files if isinstance(train_files, str) else train_files[0]
        _, summary = run_trl(settings, cfg.actor_rollout_ref.model.path, train_file, args.threads, args.warmup)
    emit(
        {
            "benchmark": "trl",
            "algo": "grpo",
            "beta": settings["grpo"]["beta"],
            "bf16": settings["grpo"]["bf16"],
            "lora": settings["lora"],
            "hidden": args.hidden,
            "layers": args.layers,
            "model_path": cfg.actor_rollout_ref.model.path,
            "train_file": train_file,
            "prompts": args.prompts,
            "n": args.n,
            "response_length": args.response_length,
            "steps": args.steps,
            "warmup": args.warmup,
            **summary,
            "settings": {k: v for k, v in settings["grpo"].items() if k != "output_dir"},
            "machine": machine(args.device),
        }
    )


if __name__ == "__main__":
    main()
