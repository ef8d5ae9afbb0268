"""GSM8K -> ColoRL parquet files, offline: ``python -m data.preprocess.gsm8k --local_dir <in> --out_dir <out>``.

The input is a local copy of GSM8K (``question``/``answer`` rows) in any of these layouts, per split:

- ``<local_dir>/<split>/`` saved by ``datasets`` (``save_to_disk`` of a Dataset or of a DatasetDict);
- ``<local_dir>/<split>.parquet`` or shards ``<split>-*.parquet``, also under ``main/`` (the Hugging Face layout);
- ``<local_dir>/<split>.jsonl`` (the layout of OpenAI's repository).

Each output row follows the dataset's layout (``data.dataset``)::

    {"data_source": "openai/gsm8k", "ability": "math",
     "prompt": [{"role": "user", "content": question + ' Let\\'s think step by step and output ... "####".'}],
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 0, "answer": answer, "question": question}}

The prompt is a chat message list: ``RLHFDataset`` renders it with the tokenizer's chat template when the
tokenizer has one. The ground truth is the number after ``####`` in the reference answer, commas removed.

``--tools`` writes the tool-agent layout instead: each row also has ``"agent_name": "tool_agent"``, a system
prompt asking for the answer-checking tool, and ``extra_info.tools_kwargs.calc_gsm8k_reward.create_kwargs.
ground_truth``. Train on it with
``actor_rollout_ref.rollout.multi_turn.enable=true`` and ``...multi_turn.tool_config_path=conf/tools/gsm8k.yaml``.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from data.preprocess.splits import write_splits
from data.rewards.gsm8k import DATA_SOURCE, extract_answer

SPLITS = ("train", "test")
COLUMNS = ("question", "answer")
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
TOOL = "calc_gsm8k_reward"
TOOL_SYSTEM = (
    "You are a math expert. Solve the question step by step. After solving it, call the calc_gsm8k_reward "
    "tool with your answer at least once, and refine the answer if the tool says it is incorrect. Put "
    "your final answer in the format #### <answer>."
)


def _split_files(local_dir: Path, split: str) -> list[Path]:
    """The parquet or jsonl files of ``split`` in the first layout that has any."""
    for base in (local_dir, local_dir / "main"):
        for pattern in (f"{split}.parquet", f"{split}-*.parquet", f"{split}.jsonl"):
            files = sorted(base.glob(pattern))
            if files:
                return files
    return []


def _read_records(path: Path) -> list[dict[str, Any]]:
    if path.is_dir():  # saved by datasets.save_to_disk
        import datasets  # deferred: only this layout needs it

        return datasets.load_from_disk(str(path)).to_list()
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def load_split(local_dir: str | os.PathLike, split: str) -> list[dict[str, Any]]:
    """The ``question``/``answer`` records of one split of a local GSM8K copy (layouts: see the module docstring)."""
    root = Path(local_dir).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"--local_dir {str(root)!r}: no such directory (a local copy of GSM8K)")
    saved = root / split
    files = [saved] if (saved / "state.json").is_file() else _split_files(root, split)
    if not files:
        raise FileNotFoundError(
            f"no {split!r} split in {str(root)!r}: expected {split}/ saved by datasets, {split}.parquet, "
            f"{split}-*.parquet (also under main/) or {split}.jsonl"
        )
    records: list[dict[str, Any]] = []
    for path in files:
        part = _read_records(path)
        columns = list(part[0]) if part else []
        missing = [c for c in COLUMNS if c not in columns]
        if part and missing:
            raise ValueError(f"{str(path)!r} has no column {missing[0]!r}; its columns are {columns}")
        records.extend(part)
    if not records:
        raise ValueError(f"the {split!r} split in {str(root)!r} is empty ({[str(p) for p in files]})")
    return records


def make_row(question: str, answer: str, split: str, index: int) -> dict[str, Any]:
    """One GSM8K dataset row; the ground truth is the number after ``####`` in ``answer``."""
    ground_truth = extract_answer(answer, "strict")
    if ground_truth is None:
        raise ValueError(f"{split} row {index}: the answer has no '#### <number>' line: {answer[-80:]!r}")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def make_tool_row(question: str, answer: str, split: str, index: int) -> dict[str, Any]:
    """``make_row`` in the tool-agent layout: a system prompt, ``agent_name`` and the tool's ``create_kwargs``."""
    row = make_row(question, answer, split, index)
    truth = row["reward_model"]["ground_truth"]
    return {
        **row,
        "agent_name": "tool_agent",
        "prompt": [{"role": "system", "content": TOOL_SYSTEM}, *row["prompt"]],
        "extra_info": {
            **row["extra_info"],
            "need_tools_kwargs": True,
            "tools_kwargs": {TOOL: {"create_kwargs": {"ground_truth": truth}}},
        },
    }


def preprocess(
    local_dir: str | os.PathLike, out_dir: str | os.PathLike, splits: Sequence[str] = SPLITS, tools: bool = False
) -> dict[str, Path]:
    """Write ``<out_dir>/<split>.parquet`` for every split; returns split -> path. Every split is read first."""
    make = make_tool_row if tools else make_row
    rows = {
        split: [make(r["question"], r["answer"], split, i) for i, r in enumerate(load_split(local_dir, split))]
        for split in splits
    }
    return write_splits(rows, out_dir)


def main(argv: Sequence[str] | None = None) -> None:
    """The command line; a missing directory, split or column is one line on stderr and exit status 2."""
    parser = argparse.ArgumentParser(prog="python -m data.preprocess.gsm8k", description=__doc__.splitlines()[0])
    parser.add_argument("--local_dir", required=True, help="local GSM8K copy with train/test splits")
    parser.add_argument("--out_dir", default="~/data/gsm8k", help="where train.parquet/test.parquet go")
    parser.add_argument("--splits", nargs="+", default=list(SPLITS), help="splits to convert (default: train test)")
    parser.add_argument("--tools", action="store_true", help="the tool-agent layout (calc_gsm8k_reward)")
    args = parser.parse_args(argv)
    try:
        written = preprocess(args.local_dir, args.out_dir, args.splits, args.tools)
    except (OSError, ValueError) as exc:
        parser.exit(2, f"gsm8k: error: {exc}\n")
    for split, path in written.items():
        print(f"{split}: {pq.read_metadata(path).num_rows} rows -> {path}")


if __name__ == "__main__":
    main()
