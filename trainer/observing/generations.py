"""What the model wrote: the generation dumps and the samples of the run report, one format for both.

A dump is a directory of ``<step>.jsonl`` files, one JSON object per response (``write_generations``,
``read_generations``). The dump's own fields come first: ``input`` and ``output`` (the prompt and the response, decoded
with special tokens skipped), ``gts`` (``reward_model.ground_truth``), ``score`` (the reward's sum over the tokens) and
``step``; then each per-row value the reward function returned under its own name (one named ``score`` replaces the sum
there). Then ``reward`` (the sum, always), ``data_source``, ``uid`` (a prompt's responses share it), ``response_length``
(every real token, tool turns included), ``clipped`` (the response reached ``data.max_response_length``) and for
multi-turn rows ``messages`` (the conversation: prompt, assistant turns, tool answers), ``num_turns``,
``tool_call_counts``, ``tool_error_counts`` and ``stop_reason``.

The rows the run report shows (``trainer.report.samples_per_step`` a step: the best and worst reward, a response
cut at the length limit, one with a tool error, then one prompt's whole group, then others) also carry the tokens
as training saw them, over the response's real tokens: ``token_ids``, ``tokens`` (each decoded alone), ``trained``
(1: a model token in the loss, 0: masked, e.g. a tool answer), ``advantages`` and, when the step has them,
``log_probs`` (the sampling policy's log-prob of each token). They go to ``<default_local_dir>/samples/{train,val}``;
``trainer.rollout_data_dir`` and ``trainer.validation_data_dir`` receive every row (the sampled ones with their
tokens too).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from single_controller.data_proto import DataProto

ROW_COLUMNS = {  # the multi-turn rollout's per-row columns (workers.compute.agent_loop) -> their name in a record
    "messages": "messages",
    "__num_turns__": "num_turns",
    "tool_call_counts": "tool_call_counts",
    "tool_error_counts": "tool_error_counts",
    "stop_reason": "stop_reason",
}
Prompts = tuple[torch.Tensor, torch.Tensor]  # the left-padded prompts' ids and attention mask (B, P)
SAMPLES_DIR = "samples"  # under trainer.default_local_dir: train/<step>.jsonl and val/<step>.jsonl


def write_generations(directory: str | os.PathLike, step: int, records: Sequence[dict[str, Any]]) -> Path:
    """``<directory>/<step>.jsonl``: one JSON line per record; returns the path."""
    path = Path(directory) / f"{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, ensure_ascii=False, default=_plain) + "\n" for r in records)
    path.write_text(text, encoding="utf-8")
    return path


def read_generations(directory: str | os.PathLike) -> dict[int, list[dict[str, Any]]]:
    """Every ``<step>.jsonl`` under ``directory`` as step -> its records (a partial last line is skipped)."""
    paths = {int(path.stem): path for path in Path(directory).glob("*.jsonl") if path.stem.isdigit()}
    return {step: read_jsonl(paths[step]) for step in sorted(paths)}


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of one dump file (a partial last line, from a write cut short, is skipped)."""
    records = []
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def drop_steps_after(directory: str | os.PathLike, step: int) -> None:
    """Remove the files of steps after ``step``: a resumed run computes them again."""
    for path in Path(directory).glob("*.jsonl"):
        if path.stem.isdigit() and int(path.stem) > step:
            path.unlink(missing_ok=True)


def _plain(value: Any) -> Any:
    """What json cannot write itself: numpy and torch values as Python ones, anything else as its text."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _round(values: Sequence[float]) -> list[float]:
    """4 significant digits: the report shows colours and hovers, not the 8th digit."""
    return [float(f"{v:.4g}") if math.isfinite(v) else None for v in values]


def pick_samples(
    rewards: Sequence[float],
    clipped: Sequence[bool],
    tool_errors: Sequence[int],
    uids: Sequence[Any],
    k: int,
    seed: int,
) -> list[int]:
    """Up to ``k`` row indices: the best and the worst reward, a clipped row, a row with a tool error, then the
    rows of one prompt group (a random row's), then random rows; in that order, each row once."""
    n = len(rewards)
    rng = random.Random(seed)
    order = list(range(n))
    rng.shuffle(order)  # ties and fills are random, yet the same for the same seed
    picked: list[int] = []

    def add(rows: Sequence[int]) -> None:
        for row in rows:
            if len(picked) < k and row not in picked:
                picked.append(row)

    if n == 0 or k == 0:
        return []
    add([max(order, key=lambda i: rewards[i]), min(order, key=lambda i: rewards[i])])
    add([i for i in order if clipped[i]][:1])
    add([i for i in order if tool_errors[i] > 0][:1])
    group = uids[order[0]]
    add([i for i in range(n) if uids[i] == group])
    add(order)
    return picked


class GenerationLog:
    """The driver's writer of dumps and report samples; ``trainer`` is ``config.trainer``."""

    def __init__(self, trainer: Any, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.rollout_dir, self.validation_dir = trainer.rollout_data_dir, trainer.validation_data_dir
        self.samples_per_step = trainer.report.samples_per_step if trainer.report.enable else 0
        self.samples_dir = Path(trainer.default_local_dir) / SAMPLES_DIR
        self.log_val_generations = trainer.log_val_generations

    def drop_steps_after(self, step: int) -> None:
        """Remove what an earlier attempt wrote for the steps after ``step`` (a resumed run computes them again);
        a fresh run (step 0) leaves the dump directories, which may be shared."""
        dumps = (self.rollout_dir, self.validation_dir) if step > 0 else ()
        for directory in (self.samples_dir / "train", self.samples_dir / "val", *dumps):
            if directory is not None:
                drop_steps_after(directory, step)

    def training_step(self, batch: DataProto, prompts: Prompts, extras: dict[str, list], step: int) -> None:
        """Write step ``step``'s dump (``rollout_data_dir``) and report samples. ``batch`` is the step's, after the
        advantages; ``prompts`` the left-padded prompts the rollout was given, ids and attention mask (B, P)."""
        self._write(batch, prompts, extras, step, self.rollout_dir, "train")

    def validation(self, parts: list[tuple[DataProto, Prompts, dict[str, list]]], step: int, logger: Any) -> None:
        """Write a validation's dump (``validation_data_dir``) and samples, and hand ``log_val_generations`` of them
        to ``logger`` (sorted by prompt, shuffled with seed 42, the first N: the same N for every validation)."""
        if not parts:
            return
        # each validation batch carries its own step token (meta_info): only the rows are joined
        batch = DataProto.concat([dataclasses.replace(p[0], meta_info={}) for p in parts])
        # every batch is padded to data.max_prompt_length
        prompts = (torch.cat([p[1][0] for p in parts]), torch.cat([p[1][1] for p in parts]))
        extras: dict[str, list] = {}
        for _, _, part_extras in parts:
            for key, values in part_extras.items():
                extras.setdefault(key, []).extend(values)
        extras = {k: v for k, v in extras.items() if len(v) == len(batch)}
        records = self._write(batch, prompts, extras, step, self.validation_dir, "val")
        if self.log_val_generations > 0 and logger is not None:
            samples = sorted(((r["input"], r["output"], r["score"]) for r in records), key=lambda s: s[0])
            order = np.random.RandomState(42).permutation(len(samples))
            logger.log_generations([samples[i] for i in order[: self.log_val_generations]], step)

    def _write(
        self,
        batch: DataProto,
        prompts: Prompts,
        extras: dict[str, list],
        step: int,
        dump_dir: str | None,
        kind: str,
    ) -> list[dict[str, Any]]:
        every = dump_dir is not None or (kind == "val" and self.log_val_generations > 0)
        rows = self._rows(batch, step)
        records = {i: {} for i in (range(len(batch)) if every else rows)}
        if not records:
            return []
        _fill_text(records, batch, prompts, extras, step, self.tokenizer)
        for i in rows:
            records[i].update(_token_fields(batch, i, self.tokenizer))
        try:
            if dump_dir is not None:
                write_generations(dump_dir, step, list(records.values()))
            if rows:
                write_generations(self.samples_dir / kind, step, [records[i] for i in rows])
        except OSError as exc:  # a full disk: the run goes on (its checkpoint save will say more)
            print(f"colorl: warning: cannot write the generations of step {step} ({exc})", file=sys.stderr)
        return list(records.values())

    def _rows(self, batch: DataProto, step: int) -> list[int]:
        if self.samples_per_step == 0:
            return []
        columns = batch.non_tensor_batch
        n = len(batch)
        return pick_samples(
            batch.batch["token_level_scores"].sum(-1).tolist(),
            _clipped(batch).tolist(),
            [int(v) for v in columns.get("tool_error_counts", [0] * n)],
            list(columns.get("uid", range(n))),
            self.samples_per_step,
            seed=step,
        )


def _clipped(batch: DataProto) -> torch.Tensor:
    """(B,) True where the response used every position: cut at the length limit (``response_length/clip_ratio``)."""
    width = batch.batch["responses"].shape[-1]
    return _response_tokens(batch).sum(-1) == width


def _response_tokens(batch: DataProto) -> torch.Tensor:
    """(B, R) 1 on every real response token, tool turns included (the rollout's attention mask over the
    response; its response mask where a stand-in rollout gives no attention mask)."""
    tensors = batch.batch
    if "attention_mask" not in tensors:
        return tensors["response_mask"]
    return tensors["attention_mask"][:, -tensors["responses"].shape[-1] :]


def _fill_text(
    records: dict[int, dict[str, Any]],
    batch: DataProto,
    prompts: Prompts,
    extras: dict[str, list],
    step: int,
    tokenizer: Any,
) -> None:
    """The dump's fields and the per-row ones into ``records`` (row -> record), one batched decode each."""
    rows = list(records)
    valid = _response_tokens(batch).bool()
    ids, mask = prompts
    inputs = tokenizer.batch_decode([ids[i][mask[i].bool()].tolist() for i in rows], skip_special_tokens=True)
    responses = batch.batch["responses"]
    outputs = tokenizer.batch_decode([responses[i][valid[i]].tolist() for i in rows], skip_special_tokens=True)
    rewards = batch.batch["token_level_scores"].sum(-1).tolist() if "token_level_scores" in batch.batch else None
    clipped = _clipped(batch).tolist()
    columns = batch.non_tensor_batch
    for j, i in enumerate(rows):
        reward_model = columns.get("reward_model", [None] * len(batch))[i]
        record = records[i]
        record.update(
            input=inputs[j],
            output=outputs[j],
            gts=reward_model.get("ground_truth") if isinstance(reward_model, dict) else None,
            score=rewards[i] if rewards is not None else None,
            step=step,
        )
        record.update({key: values[i] for key, values in extras.items()})
        record.update(
            reward=rewards[i] if rewards is not None else None,
            data_source=str(columns["data_source"][i]) if "data_source" in columns else None,
            uid=str(columns["uid"][i]) if "uid" in columns else None,
            response_length=int(valid[i].sum()),
            clipped=bool(clipped[i]),
        )
        record.update({name: columns[key][i] for key, name in ROW_COLUMNS.items() if key in columns})


def _token_fields(batch: DataProto, row: int, tokenizer: Any) -> dict[str, Any]:
    """Row ``row``'s response tokens as training saw them (see the module's docstring)."""
    tensors = batch.batch
    length = int(_response_tokens(batch)[row].sum())  # the real tokens are a prefix of the response
    ids = tensors["responses"][row, :length].tolist()
    fields: dict[str, Any] = {
        "token_ids": ids,
        "tokens": tokenizer.batch_decode([[t] for t in ids], skip_special_tokens=False),
        "trained": tensors["response_mask"][row, :length].int().tolist(),
    }
    if "advantages" in tensors:
        fields["advantages"] = _round(tensors["advantages"][row, :length].tolist())
    for key in ("old_log_probs", "rollout_log_probs"):
        if key in tensors:
            fields["log_probs"] = _round(tensors[key][row, :length].tolist())
            break
    return fields
