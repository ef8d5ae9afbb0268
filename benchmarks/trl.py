"""Peer baseline: TRL's ``GRPOTrainer`` on the same model, tokenizer, task, reward and step shape.

    python -m benchmarks.trl [--hidden 128 --layers 2] [--prompts 16 --n 8] [--response-length 8]
                             [--threads N] [--steps 20 --warmup 3] [--device cpu|cuda]

TRL is installed into its own venv, ``benchmarks/.trl-venv`` (made on first use with ``python3 -m venv``:
torch first, then trl and the transformers version ColoRL uses); ColoRL never imports it. This process
prepares the built-in assets (``data.builtin.prepare_builtin``, the same cache as ``benchmarks.step``) and
runs a small script with the venv's python. That script trains ``GRPOConfig`` as the CPU feasibility study
did: prompts·n completions per step, one optimisation pass (``num_iterations=1``), beta=0 (with ``--kl``:
ColoRL's ``actor.kl_loss_coef``, and TRL loads a reference model; its KL term is k3, ColoRL's default
``low_var_kl``), DAPO loss, no gradient checkpointing, ``bf16`` where ColoRL's actor computes in bf16 (its
``fsdp_config.mixed_precision``: by default on CUDA, not on CPU; TRL's bf16 is autocast over fp32 weights),
with ColoRL's reward function for the task (``data/tasks.py``, imported with the repository on ``PYTHONPATH``).

Prints JSON: median s/step (callback ``on_step_begin`` -> ``on_step_end``), median time inside ``generate``,
completion tokens/s (mean completion length × prompts·n / step time) and the inner process's peak RSS.
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

from benchmarks.common import add_batch_args, add_model_args, emit, machine, stdout_to_stderr

VENV = Path(__file__).resolve().parent / ".trl-venv"
REPO = Path(__file__).resolve().parent.parent
TORCH = "torch==2.13.0"  # first and pinned: on CPU machines it resolves to the local CPU wheel
PACKAGES = ["trl==1.16.0", "transformers==5.23.0"]
INNER_ARGS = ("prompts", "n", "response_length", "steps", "warmup", "threads", "device", "seed", "beta", "bf16")

INNER = r'''
import json, statistics, sys, time
import torch

args = json.loads(sys.argv[1])
if args["device"] == "cpu":
    torch.set_num_threads(args["threads"])
import datasets, transformers, trl
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from data.tasks import default_compute_score  # ColoRL's reward code (pure Python), on PYTHONPATH

tokenizer = AutoTokenizer.from_pretrained(args["model_path"])
model = AutoModelForCausalLM.from_pretrained(args["model_path"], dtype=torch.float32)
eos_id = tokenizer.eos_token_id
gen_times = []
hf_generate = model.generate

def timed_generate(*a, **k):
    if args["device"] == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = hf_generate(*a, **k)
    if args["device"] == "cuda":
        torch.cuda.synchronize()
    gen_times.append(time.perf_counter() - start)
    return out

model.generate = timed_generate  # TRL calls generate on the unwrapped model: this very object

def reward(prompts, completions, completion_ids, data_source, reward_model, **kwargs):
    """ColoRL's score: decoded without special tokens, stopped_by_eos from the last kept id."""
    return [
        default_compute_score(src, text, rm["ground_truth"], {"stopped_by_eos": bool(ids) and ids[-1] == eos_id})
        for src, text, rm, ids in zip(data_source, completions, reward_model, completion_ids)
    ]

class StepTimer(TrainerCallback):
    def __init__(self):
        self.steps, self.logs, self.gen = [], [], []
    def on_step_begin(self, a, state, control, **kw):
        self.start, self.gen_mark = time.perf_counter(), len(gen_times)
    def on_step_end(self, a, state, control, **kw):
        self.steps.append(time.perf_counter() - self.start)
        self.gen.append(sum(gen_times[self.gen_mark:]))
    def on_log(self, a, state, control, logs=None, **kw):
        self.logs.append(dict(logs or {}))

P, G, T = args["prompts"], args["n"], args["response_length"]
config = GRPOConfig(
    output_dir=args["output_dir"], per_device_train_batch_size=P * G, num_generations=G,
    gradient_accumulation_steps=1, num_iterations=1, max_completion_length=T, temperature=1.0, top_p=1.0,
    learning_rate=1e-3, lr_scheduler_type="constant", warmup_steps=0, adam_beta2=0.99, weight_decay=0.0,
    max_grad_norm=1.0, beta=args["beta"], epsilon=0.2, loss_type="dapo", scale_rewards="group",
    use_cpu=args["device"] == "cpu", bf16=args["bf16"], gradient_checkpointing=False,
    disable_dropout=True, logging_steps=1, report_to="none", save_strategy="no",
    max_steps=args["warmup"] + args["steps"], seed=args["seed"],
)
train = datasets.load_dataset("parquet", data_files=args["train_file"], split="train")
timer = StepTimer()
trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=train,
                      processing_class=tokenizer, callbacks=[timer])
trainer.train()

def peak_rss_mb():
    """VmHWM: this process's own peak (ru_maxrss would include the parent's, inherited through fork)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)

w = args["warmup"]
steps, gens = timer.steps[w:], timer.gen[w:]
lengths = [l["completions/mean_length"] for l in timer.logs if "completions/mean_length" in l][w:]
rewards = [l["reward"] for l in timer.logs if "reward" in l][w:]
tokens_per_s = [length * P * G / s for length, s in zip(lengths, steps)]
print(json.dumps({
    "s_per_step": round(statistics.median(steps), 4),
    "s_per_step_all": [round(s, 4) for s in steps],
    "gen_s": round(statistics.median(gens), 4),
    "completion_tokens_per_s": round(statistics.median(tokens_per_s), 1) if tokens_per_s else None,
    "completion_length_mean": round(statistics.median(lengths), 3) if lengths else None,
    "reward_mean": round(statistics.median(rewards), 4) if rewards else None,
    "peak_rss_mb": peak_rss_mb(),
    "ref_model": trainer.ref_model is not None,  # loaded only when beta > 0
    "threads": torch.get_num_threads(),
    "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
}))
'''


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(parser)
    add_batch_args(parser)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (CPU)")
    args = parser.parse_args(argv)
    if args.algo != "grpo":
        parser.error("the TRL baseline is GRPOTrainer: --algo grpo only")
    args.beta, args.bf16 = colorl_settings(args)
    return args


def colorl_settings(args: argparse.Namespace) -> tuple[float, bool]:
    """(KL coefficient, bf16) of ColoRL's actor for these flags (``--set`` included): TRL gets the same.

    The KL coefficient is 0 without ``--kl``; TRL's KL term is k3 (``low_var_kl``).
    """
    import torch

    from benchmarks.common import load_bench_config
    from workers import fsdp

    with tempfile.TemporaryDirectory(prefix="colorl-bench-trl-") as local_dir:
        arr = load_bench_config(args, 1, local_dir).actor_rollout_ref
    actor = arr.actor
    if arr.model.lora_rank > 0:  # TRL here trains every weight: its figure would not be the same work
        raise SystemExit(f"benchmarks.trl: actor_rollout_ref.model.lora_rank={arr.model.lora_rank}: the TRL "
                         "baseline trains all weights; compare LoRA runs against the floor (compare --no-trl)")
    bf16 = fsdp.compute_dtype(torch.device(args.device), actor.fsdp_config.mixed_precision) == torch.bfloat16
    if not args.kl:
        return 0.0, bf16
    if actor.kl_loss_type not in ("low_var_kl", "k3"):
        raise SystemExit(f"benchmarks.trl --kl: TRL's KL is k3; actor_rollout_ref.actor.kl_loss_type="
                         f"{actor.kl_loss_type!r} has no TRL equivalent (use low_var_kl or k3)")
    return float(actor.kl_loss_coef), bf16


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
            sys.exit(f"benchmarks.trl: could not set up the TRL venv: `{' '.join(command)}` exited with "
                     f"{result.returncode} (see pip's message above); delete {VENV} to start over")
    stamp.touch()
    return python


def prepare_assets(args: argparse.Namespace) -> dict[str, str]:
    """The built-in model/tokenizer and train parquet (the same cache entry ``benchmarks.step`` uses)."""
    from config.schema import BuiltinConfig
    from data.builtin import prepare_builtin

    builtin = BuiltinConfig()
    with stdout_to_stderr():
        assets = prepare_builtin(
            cache_dir=os.path.abspath(args.cache_dir), task=args.task, num_train=builtin.num_train,
            num_val=builtin.num_val, sft_warmup_steps=args.sft_warmup_steps, hidden_size=args.hidden,
            num_layers=args.layers, seed=args.seed,
        )
    if args.model_path:
        assets["model_path"] = os.path.abspath(args.model_path)
    return assets


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    python = venv_python()
    assets = prepare_assets(args)
    with tempfile.TemporaryDirectory(prefix="colorl-bench-trl-") as tmp:
        script = Path(tmp) / "trl_grpo.py"
        script.write_text(INNER)
        inner_args = {
            **{k: getattr(args, k) for k in INNER_ARGS},
            "model_path": assets["model_path"], "train_file": assets["train_files"],
            "output_dir": str(Path(tmp) / "out"),
        }
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}  # for data.tasks
        result = subprocess.run([str(python), str(script), json.dumps(inner_args)], stdout=subprocess.PIPE,
                                stderr=sys.stderr, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"benchmarks.trl: the TRL run failed (exit {result.returncode}); its traceback is above")
    emit({
        "benchmark": "trl", "algo": "grpo", "beta": args.beta, "bf16": args.bf16, "hidden": args.hidden,
        "layers": args.layers,
        "model_path": assets["model_path"], "prompts": args.prompts, "n": args.n,
        "response_length": args.response_length, "steps": args.steps, "warmup": args.warmup,
        **json.loads(result.stdout.strip().splitlines()[-1]),
        "machine": machine(args.device),
    })


if __name__ == "__main__":
    main()
