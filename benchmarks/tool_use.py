"""Greedy accuracy and tool-call rate of a Hugging Face model on a parquet file, through ColoRL's multi-turn rollout.

    python -m benchmarks.tool_use --model DIR --data test.parquet [--tool-config conf/tools/calculator.yaml]
                                  [--limit 64] [--response-length 160] [--batch-size 16] [--threads 2] [--show 3]

Prompts are rendered as ``RLHFDataset`` renders them (``tool_agent`` rows with the tools' schemas), rolled out by
``workers.compute.agent_loop`` exactly as in training (tool turns, limits, parsing) and scored by the trainer's reward
manager (``data.tasks.default_compute_score``: strict ``#### N`` for the arithmetic problems). Without
``--tool-config`` every tool call is answered "unknown tool". Prints JSON: ``accuracy`` (mean strict score), the
mean of every extra value the score gives (``flexible``), ``tool_call_rate`` (share of problems with a call),
calls, errors and turns per problem, the stop reasons, seconds, and the first ``--show`` conversations.

The tools benchmark of docs/benchmarks_learning.md evaluates the untrained model and the models exported
(``python -m trainer.export RUN_DIR --out DIR``) from 30-minute runs of ``conf/smollm2_tools.yaml`` (with the
calculator) and ``conf/smollm2_arith.yaml`` on the same two-step problems without tools.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import statistics
import time
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks.common import default_device, emit, machine
from config.sections import MultiTurnConfig
from data.dataset import RLHFDataset
from data.reward import RewardManager
from single_controller.data_proto import DataProto
from verl_compat import tools as _verl_tools  # noqa: F401  (verl's tool names, e.g. conf/tools/gsm8k.yaml, as main.py)
from workers.compute.agent_loop import AgentLoop
from workers.tools import ToolBox, load_tools
from workers.tools.turns import eos_token_ids


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model directory")
    parser.add_argument("--data", required=True, help="a parquet file in verl's layout")
    parser.add_argument("--tool-config", default=None, help="verl tool YAML (multi_turn.tool_config_path)")
    parser.add_argument("--limit", type=int, default=64, help="the first LIMIT rows")
    parser.add_argument("--prompt-length", type=int, default=256)
    parser.add_argument("--response-length", type=int, default=160, help="model and tool tokens per problem")
    parser.add_argument("--max-assistant-turns", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (CPU)")
    parser.add_argument("--device", default=default_device())
    parser.add_argument("--show", type=int, default=3, help="conversations to include in the output")
    return parser.parse_args(argv)


@dataclasses.dataclass
class Tally:
    """What the batches rolled out so far gave: scores, the reward's extra values and the loop's per-row stats by
    name, the decoded responses and each batch's seconds."""

    scores: list[float] = dataclasses.field(default_factory=list)
    extras: dict[str, list[float]] = dataclasses.field(default_factory=lambda: collections.defaultdict(list))
    rows: dict[str, list[Any]] = dataclasses.field(default_factory=lambda: collections.defaultdict(list))
    shown: list[str] = dataclasses.field(default_factory=list)
    batch_s: list[float] = dataclasses.field(default_factory=list)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(args.device).eval()
    multi_turn = MultiTurnConfig(
        enable=True, tool_config_path=args.tool_config, max_assistant_turns=args.max_assistant_turns
    )
    toolbox = ToolBox(load_tools(args.tool_config, None), multi_turn)
    dataset = RLHFDataset(
        args.data, tokenizer, max_prompt_length=args.prompt_length, max_samples=args.limit, tool_schemas=toolbox.schemas
    )
    loop = AgentLoop(tokenizer, toolbox, multi_turn, default_agent="single_turn_agent")
    tally = roll_out(args, model, tokenizer, dataset, loop)
    emit(report(args, dataset, tally))


def roll_out(
    args: argparse.Namespace, model: torch.nn.Module, tokenizer: Any, dataset: RLHFDataset, loop: AgentLoop
) -> Tally:
    """Greedy multi-turn rollouts of ``dataset`` in batches of ``--batch-size``, scored by the trainer's reward."""
    reward = RewardManager(tokenizer)
    eos = eos_token_ids(model.generation_config, tokenizer)
    tally = Tally()
    for start in range(0, len(dataset), args.batch_size):
        collated = dataset.collate_fn([dataset[i] for i in range(start, min(start + args.batch_size, len(dataset)))])
        batch = DataProto.from_single_dict(collated)
        began = time.perf_counter()
        tensors, stats, _ = loop.generate(
            model,
            batch.batch,
            batch.non_tensor_batch,
            response_length=args.response_length,
            eos_token_id=eos,
            pad_token_id=dataset.pad_token_id,
            sampling={"do_sample": False},
        )
        tally.batch_s.append(time.perf_counter() - began)
        out = DataProto.from_dict(tensors, {**batch.non_tensor_batch, **stats})
        _, reward_extras = reward(out)
        tally.scores += reward_extras.pop("score")
        for key, values in reward_extras.items():
            tally.extras[key] += [float(v) for v in values]
        for key, values in stats.items():
            tally.rows[key] += list(values)
        tally.shown += [
            tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=False)
            for ids, mask in zip(tensors["responses"], tensors["attention_mask"][:, -args.response_length :])
        ]
    return tally


def report(args: argparse.Namespace, dataset: RLHFDataset, tally: Tally) -> dict[str, Any]:
    """The printed JSON: accuracy, the extra values' means, tool use per problem, stop reasons, seconds, examples."""
    scores, rows, shown = tally.scores, tally.rows, tally.shown
    calls = [float(c) for c in rows["tool_call_counts"]]
    return {
        "benchmark": "tool_use",
        "model": args.model,
        "data": args.data,
        "tool_config": args.tool_config,
        "rows": len(scores),
        "response_length": args.response_length,
        "threads": args.threads,
        "accuracy": statistics.fmean(scores),
        **{k: statistics.fmean(v) for k, v in tally.extras.items()},
        "tool_call_rate": statistics.fmean(c > 0 for c in calls),
        "calls_per_problem": statistics.fmean(calls),
        "errors_per_problem": statistics.fmean(float(e) for e in rows["tool_error_counts"]),
        "turns_per_problem": statistics.fmean(float(t) for t in rows["__num_turns__"]),
        "stop_reasons": dict(collections.Counter(rows["stop_reason"])),
        "s_per_batch": statistics.median(tally.batch_s),
        "total_s": sum(tally.batch_s),
        "examples": [
            {"truth": dataset[i]["reward_model"]["ground_truth"], "conversation": shown[i], "score": scores[i]}
            for i in range(min(args.show, len(shown)))
        ],
        "machine": machine(args.device),
    }


if __name__ == "__main__":
    main()
