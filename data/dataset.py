"""Prompt dataset and dataloader for RL: parquet/jsonl rows (``data_source``, ``prompt``, ``reward_model``,
``extra_info``) -> left-padded prompt batches."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler, SequentialSampler
from transformers import PreTrainedTokenizerBase

from data.prompt_files import read_rows

logger = logging.getLogger(__name__)

NON_TENSOR_KEYS = ("data_source", "reward_model", "extra_info", "raw_prompt", "agent_name", "tools_kwargs")
TOOL_AGENT = "tool_agent"  # the agent_name of the multi-turn tool loop (workers.compute.agent_loop)
# the non-tensor column of each prompt's position in the dataset (its rows as kept: after filter_overlong_prompts and
# max_samples); the run's ledger of what was trained counts prompts by it (trainer.state.ledger)
INDEX = "dataset_index"


class RLHFDataset(Dataset):
    """Prompts tokenised once at construction. Rows longer than ``max_prompt_length`` tokens are dropped (and
    counted) with ``filter_overlong_prompts``; otherwise ``truncation`` (``data.truncation``) says what
    happens to them: ``error``, or keep their ``left`` (last) tokens, ``right`` (first) or ``middle`` (both ends).
    ``max_samples`` > 0 keeps only the first that many prompts (``data.train_max_samples``/``val_max_samples``).

    A prompt is either a string (tokenised as is) or a list of chat messages (``{"role", "content"}``), which
    go through the tokenizer's chat template with the generation prompt when it has one, else are joined.

    Multi-turn rows: a row's ``agent_name`` (else ``default_agent``) picks its rollout loop, and
    ``extra_info.tools_kwargs`` the per-tool arguments of its tools (non-tensor ``tools_kwargs``). A
    ``tool_agent`` chat prompt is rendered with ``tool_schemas`` (the template's ``tools=``), exactly as the
    rollout renders the later turns; ``num_tool_agent_rows`` counts such rows.
    """

    def __init__(
        self,
        files: str | Sequence[str],
        tokenizer: PreTrainedTokenizerBase,
        prompt_key: str = "prompt",
        max_prompt_length: int = 16,
        filter_overlong_prompts: bool = True,
        truncation: str = "error",
        max_samples: int = -1,
        tool_schemas: Sequence[dict] | None = None,
        default_agent: str = "single_turn_agent",
        reward_fn_key: str = "data_source",
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.chat_template_kwargs = dict(chat_template_kwargs or {})  # data.apply_chat_template_kwargs
        self.files = [str(files)] if isinstance(files, (str, os.PathLike)) else [str(f) for f in files]
        if not self.files:
            raise ValueError("no data files given")
        self.tokenizer = tokenizer
        self.prompt_key = prompt_key
        self.max_prompt_length = max_prompt_length
        # the column that picks each row's reward function (data.reward_fn_key) travels with the row
        self.non_tensor_keys = NON_TENSOR_KEYS + (() if reward_fn_key in NON_TENSOR_KEYS else (reward_fn_key,))
        columns = {prompt_key: "data.prompt_key"}
        if reward_fn_key != "data_source":  # the default column may be absent (a custom reward function ignores it)
            columns[reward_fn_key] = "data.reward_fn_key"
        self.tool_schemas, self.default_agent = list(tool_schemas or []), default_agent
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad_id is None:
            raise ValueError("the tokenizer has neither a pad nor an eos token to pad prompts with")
        self.pad_token_id = int(pad_id)

        # Files are chained row by row, not concatenated as tables: files of different data sources may hold
        # different columns (GSM8K's chat prompt and extra_info beside a plain-string task).
        rows = [
            self._make_row(record, path, i) for path in self.files for i, record in enumerate(read_rows(path, columns))
        ]
        keep = self._fit_to_length(rows, filter_overlong_prompts, truncation)
        self.rows = keep[:max_samples] if max_samples > 0 else keep
        self.num_tool_agent_rows = sum(row["agent_name"] == TOOL_AGENT for row in self.rows)

    def _fit_to_length(
        self, rows: list[dict[str, Any]], filter_overlong_prompts: bool, truncation: str
    ) -> list[dict[str, Any]]:
        """The rows whose prompts fit ``max_prompt_length`` (after ``truncation`` where overlong ones are not
        filtered); ``num_filtered`` counts those dropped. Raises where none fits, or where some do not and
        filtering is off."""
        max_prompt_length = self.max_prompt_length
        if not filter_overlong_prompts and truncation != "error":
            rows = [{**row, "input_ids": _truncate(row["input_ids"], max_prompt_length, truncation)} for row in rows]
        keep = [row for row in rows if len(row["input_ids"]) <= max_prompt_length]
        self.num_filtered = len(rows) - len(keep)
        if self.num_filtered and not filter_overlong_prompts:
            raise ValueError(
                f"{self.num_filtered} of {len(rows)} prompts are longer than max_prompt_length={max_prompt_length} "
                "tokens; raise data.max_prompt_length, set data.filter_overlong_prompts=true to drop them, or "
                "data.truncation=left|right|middle to cut them"
            )
        if not keep:
            shortest = min(len(row["input_ids"]) for row in rows)
            raise ValueError(
                f"all {len(rows)} prompts in {self.files} are longer than max_prompt_length={max_prompt_length} "
                f"tokens (the shortest has {shortest}); raise data.max_prompt_length"
            )
        if self.num_filtered:
            logger.warning(
                "filtered %d of %d prompts longer than max_prompt_length=%d tokens (%s)",
                self.num_filtered,
                len(rows),
                max_prompt_length,
                self.files,
            )
        return keep

    def _prompt_text(self, prompt: Any, tools: list[dict] | None = None) -> str:
        if isinstance(prompt, str):
            return prompt
        messages = list(prompt)
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=False, **self.chat_template_kwargs
            )
        return "\n".join(message["content"] for message in messages)

    def _make_row(self, record: dict[str, Any], path: str, index: int) -> dict[str, Any]:
        raw_prompt = record[self.prompt_key]
        if not _is_prompt(raw_prompt):
            raise ValueError(
                f"row {index} of {path}: its {self.prompt_key!r} is {raw_prompt!r:.60}; expected a non-empty "
                "string or a list of chat messages [{'role': 'user', 'content': '...'}, ...]"
            )
        extra_info = record.get("extra_info") or {}
        agent_name = record.get("agent_name") or self.default_agent
        tools = self.tool_schemas or None if agent_name == TOOL_AGENT else None
        # The chat template already holds any special tokens, and plain prompts are taken as is.
        input_ids = self.tokenizer(self._prompt_text(raw_prompt, tools), add_special_tokens=False)["input_ids"]
        extra = {key: record.get(key) for key in self.non_tensor_keys[len(NON_TENSOR_KEYS) :]}
        return {
            "input_ids": input_ids,
            "raw_prompt": raw_prompt,
            "data_source": record.get("data_source"),
            "reward_model": record.get("reward_model") or {},
            "extra_info": extra_info,
            "agent_name": agent_name,
            "tools_kwargs": (extra_info.get("tools_kwargs") if isinstance(extra_info, dict) else None) or {},
            **extra,
        }

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {**self.rows[index], INDEX: index}

    def collate_fn(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Left-pad prompts to ``max_prompt_length``.

        Returns tensors ``input_ids``, ``attention_mask``, ``position_ids`` of shape (B, max_prompt_length),
        with position_ids = clamp(cumsum(mask) - 1, min=0) so that each prompt starts at position 0, and
        numpy object arrays (B,) for ``data_source``, ``reward_model``, ``extra_info``, ``raw_prompt``; each
        prompt's position in the dataset, ``dataset_index`` (B,) int64.
        """
        width = self.max_prompt_length
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids = row["input_ids"]
            input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[i, width - len(ids) :] = 1
        batch: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        }
        for key in self.non_tensor_keys:
            column = np.empty(len(rows), dtype=object)
            column[:] = [row[key] for row in rows]  # slice-assign keeps dicts/lists as objects
            batch[key] = column
        if all(INDEX in row for row in rows):  # rows as the dataset gives them (not its ``rows`` as stored)
            batch[INDEX] = np.array([row[INDEX] for row in rows], dtype=np.int64)
        return batch


def _is_prompt(prompt: Any) -> bool:
    """A non-empty string, or a non-empty list of {"role", "content"} messages with string content."""
    if isinstance(prompt, str):
        return prompt != ""
    messages = list(prompt) if isinstance(prompt, (list, tuple, np.ndarray)) else []
    return bool(messages) and all(
        isinstance(m, dict) and isinstance(m.get("content"), str) and "role" in m for m in messages
    )


def _truncate(ids: list[int], length: int, side: str) -> list[int]:
    """The ``length`` tokens of ``ids`` that ``side`` keeps: left: the last, right: the first, middle: both ends."""
    if len(ids) <= length:
        return ids
    if side == "left":
        return ids[-length:]
    if side == "right":
        return ids[:length]
    head = length // 2
    return ids[:head] + ids[len(ids) - (length - head) :]


def make_dataloader(
    dataset: RLHFDataset, batch_size: int, shuffle: bool = True, seed: int = 1, drop_last: bool = True
) -> DataLoader:
    """A single-process DataLoader whose shuffling comes from one seeded generator.

    The generator is ``loader.sampler.generator``; saving its ``get_state()`` with a checkpoint and restoring
    it reproduces the order of the following epochs.
    """
    generator = torch.Generator()
    generator.manual_seed(seed)
    sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=dataset.collate_fn,
        drop_last=drop_last,
        num_workers=0,
    )
