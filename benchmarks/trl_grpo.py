"""TRL's GRPOTrainer with the settings ColoRL's config maps to: run by ``benchmarks.trl`` and
``benchmarks.learning_race`` with the python of TRL's own venv (``benchmarks/.trl-venv``); ColoRL never imports it.

    <trl-venv>/bin/python benchmarks/trl_grpo.py '<json>'

The JSON holds ``grpo`` (``GRPOConfig`` keyword arguments), ``lora`` (peft ``LoraConfig`` arguments, or null),
``model_path``, ``train_file``, ``threads``, ``warmup`` (steps left out of the timing figures) and, for a race,
``eval`` ({file, every, limit, max_new_tokens}: greedy strict accuracy on held-out problems every ``every``
optimizer steps), ``launch_time`` (epoch seconds the reported minutes count from) and ``minutes`` (a wall-clock
budget from the start of training).
The reward is ColoRL's (``data.tasks.default_compute_score``, with the repository on ``PYTHONPATH``).

Prints, each on a line of its own after ``[trl_grpo] ``, a JSON object per evaluation (``{"eval": ...}``), then
the summary: median s/step (``on_step_begin`` ->
``on_step_end``), median time inside ``generate``, completion tokens/s (mean completion length × completions per
optimizer step / step time) and the process's peak RSS.
"""

import json
import statistics
import sys
import time

import torch

MARK = "[trl_grpo] "
args = json.loads(sys.argv[1])
if args["grpo"].get("use_cpu"):
    torch.set_num_threads(args["threads"])
import datasets  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from peft import LoraConfig  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from data.tasks import default_compute_score  # noqa: E402  (ColoRL's reward code, pure Python)

tokenizer = AutoTokenizer.from_pretrained(args["model_path"])
model = AutoModelForCausalLM.from_pretrained(args["model_path"], dtype=torch.float32)
eos_id = tokenizer.eos_token_id
gen_times = []
hf_generate = model.generate


def timed_generate(*a, **k):
    cuda = torch.cuda.is_available() and not args["grpo"].get("use_cpu")
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = hf_generate(*a, **k)
    if cuda:
        torch.cuda.synchronize()
    gen_times.append(time.perf_counter() - start)
    return out


model.generate = timed_generate  # TRL calls generate on the unwrapped model: this very object


def emit(result):
    """One result line on stdout, marked: the trainer prints its own log dicts there too."""
    print(MARK + json.dumps(result), flush=True)


def score(source, text, ground_truth, ids):
    """ColoRL's score: decoded without special tokens, stopped_by_eos from the last kept id (a dict's "score")."""
    value = default_compute_score(source, text, ground_truth, {"stopped_by_eos": bool(ids) and ids[-1] == eos_id})
    return value["score"] if isinstance(value, dict) else value


def reward(prompts, completions, completion_ids, data_source, reward_model, **kwargs):
    """A chat prompt's completion comes as the assistant's messages: its text is theirs, joined."""
    texts = [c if isinstance(c, str) else "".join(m["content"] for m in c) for c in completions]
    return [
        score(src, text, rm["ground_truth"], ids)
        for src, text, rm, ids in zip(data_source, texts, reward_model, completion_ids)
    ]


class StepTimer(TrainerCallback):
    def __init__(self):
        self.steps, self.logs, self.gen = [], [], []

    def on_step_begin(self, a, state, control, **kw):
        self.start, self.gen_mark = time.perf_counter(), len(gen_times)

    def on_step_end(self, a, state, control, **kw):
        self.steps.append(time.perf_counter() - self.start)
        self.gen.append(sum(gen_times[self.gen_mark :]))

    def on_log(self, a, state, control, logs=None, **kw):
        self.logs.append(dict(logs or {}))


class GreedyEval(TrainerCallback):
    """Greedy strict accuracy on held-out problems at step 0, every ``every`` steps and at the end (in minutes
    since ``launch_time``); stops training once ``minutes`` have passed since it began (ColoRL's
    ``max_wall_time_s`` also starts once the model is loaded)."""

    def __init__(self, spec, launch_time, minutes):
        rows = datasets.load_dataset("parquet", data_files=spec["file"], split="train")
        rows = rows.select(range(min(spec["limit"], len(rows))))
        self.rows, self.spec, self.launch_time, self.minutes, self.done = rows, spec, launch_time, minutes, -1

    def evaluate(self, step):
        if step == self.done:
            return
        self.done, net = step, trainer.model
        net.eval()
        right = 0
        for start in range(0, len(self.rows), 32):
            batch = self.rows.select(range(start, min(start + 32, len(self.rows))))
            texts = [
                tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in batch["prompt"]
            ]
            inputs = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
            with torch.no_grad():
                out = hf_generate(
                    **inputs,
                    max_new_tokens=self.spec["max_new_tokens"],
                    do_sample=False,
                    pad_token_id=tokenizer.pad_token_id,
                )
            for row, ids in zip(batch, out[:, inputs["input_ids"].shape[1] :].tolist()):
                ids = ids[: ids.index(eos_id) + 1] if eos_id in ids else ids
                text = tokenizer.decode(ids, skip_special_tokens=True)
                right += score(row["data_source"], text, row["reward_model"]["ground_truth"], ids)
        net.train()
        minute = (time.time() - self.launch_time) / 60
        emit({"eval": {"step": step, "minute": round(minute, 2), "strict": right / len(self.rows)}})

    def on_train_begin(self, a, state, control, **kw):
        self.train_start = time.time()
        self.evaluate(0)

    def on_step_end(self, a, state, control, **kw):
        if state.global_step % self.spec["every"] == 0:
            self.evaluate(state.global_step)
        if self.minutes is not None and time.time() - self.train_start > 60 * self.minutes:
            control.should_training_stop = True

    def on_train_end(self, a, state, control, **kw):
        self.evaluate(state.global_step)


timer = StepTimer()
callbacks = [timer]
if args.get("eval"):
    callbacks.append(GreedyEval(args["eval"], args.get("launch_time", time.time()), args.get("minutes")))
train = datasets.load_dataset("parquet", data_files=args["train_file"], split="train")
peft_config = LoraConfig(task_type="CAUSAL_LM", **args["lora"]) if args["lora"] else None
trainer = GRPOTrainer(
    model=model,
    reward_funcs=reward,
    args=GRPOConfig(**args["grpo"]),
    train_dataset=train,
    processing_class=tokenizer,
    callbacks=callbacks,
    peft_config=peft_config,
)
trainer.train()


def peak_rss_mb():
    """VmHWM: this process's own peak (ru_maxrss would include the parent's, inherited through fork)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)


w = args["warmup"]
steps, gens = timer.steps[w:] or timer.steps, timer.gen[w:] or timer.gen
lengths = [log["completions/mean_length"] for log in timer.logs if "completions/mean_length" in log][w:]
rewards = [log["reward"] for log in timer.logs if "reward" in log][w:]
completions = args["grpo"]["per_device_train_batch_size"]  # per optimizer step
tokens_per_s = [length * completions / s for length, s in zip(lengths, steps)]
emit(
    {
        "s_per_step": round(statistics.median(steps), 4),
        "s_per_step_all": [round(s, 4) for s in steps],
        "gen_s": round(statistics.median(gens), 4),
        "completion_tokens_per_s": round(statistics.median(tokens_per_s), 1) if tokens_per_s else None,
        "completion_length_mean": round(statistics.median(lengths), 3) if lengths else None,
        "reward_mean": round(statistics.median(rewards), 4) if rewards else None,
        "peak_rss_mb": peak_rss_mb(),
        "ref_model": trainer.ref_model is not None,  # loaded only when beta > 0 without peft
        "trainable_params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
        "threads": torch.get_num_threads(),
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
    }
)
