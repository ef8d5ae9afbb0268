"""The distillation teachers' phase on one rank: each teacher's scores of the student's sampled responses.

A teacher is a frozen causal LM with the student's vocabulary (``trainer.preflight.teacher_checks``). It reads the
sequences the rollout wrote and returns, per response token, what the update's distillation loss reads
(``config.distillation.teacher_outputs``): the sampled token's log-prob, or its k most likely tokens' ids and
log-probs, computed from hidden states in chunks (``workers.compute.logprob.teacher_scores``), so only k values a
token leave the forward. The teacher scores at temperature 1 (a teacher served for inference returns the
prompt's log-probs, on which the sampling temperature has no effect); the student's log-probs in the update are at
the rollout's temperature, the distribution it sampled from.

With several teachers each row goes to the teacher whose ``key`` equals its ``distillation.teacher_key`` column.
Every teacher scores all of the rank's rows and each row keeps its own teacher's scores: the FSDP ranks then run the
same forwards (a rank whose rows all belong to one teacher still takes part in the others' all-gathers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from planner.phases import forward_keys
from single_controller.data_proto import DataProto
from workers.compute.logprob import teacher_scores
from workers.compute.packing import restore_order
from workers.compute.update import micro_batches, model_device, to_device

# teacher_scores' names -> the step's keys (config.distillation.TEACHER_LOG_PROBS / TEACHER_TOPK)
STEP_KEYS = {
    "log_probs": "teacher_log_probs",
    "topk_ids": "teacher_topk_ids",
    "topk_log_probs": "teacher_topk_log_probs",
}


def score_batch(
    module: nn.Module,
    data: DataProto,
    micro_batch_size: int,
    max_token_len: int | None,
    remove_padding: bool,
    fused: bool,
    topk: int | None,
    share_prompts: bool = False,
) -> dict[str, Tensor]:
    """One teacher's scores of every row of ``data`` (CPU tensors in row order, under the step's key names):
    ``teacher_log_probs`` (B, R), or with ``topk`` ``teacher_topk_ids`` (B, R, k) and ``teacher_topk_log_probs``
    (B, R, k). Micro-batches of ``micro_batch_size`` rows, or of ``max_token_len`` valid tokens when set;
    ``share_prompts`` (with remove-padding): the rows that repeat a prompt run it once, as the actor's
    (``actor.use_prefix_grouper``). One copy from the device per call (``device_scores``)."""
    scores = device_scores(module, data, micro_batch_size, max_token_len, remove_padding, fused, topk, share_prompts)
    return {name: value.cpu() for name, value in scores.items()}


def device_scores(
    module: nn.Module,
    data: DataProto,
    micro_batch_size: int,
    max_token_len: int | None,
    remove_padding: bool,
    fused: bool,
    topk: int | None,
    share_prompts: bool = False,
) -> dict[str, Tensor]:
    """``score_batch``'s scores on the module's device."""
    module.eval()
    tensors = {k: data.batch[k] for k in forward_keys(remove_padding)}
    response_length = tensors["responses"].shape[-1]
    device = model_device(module)
    indices = micro_batches(module, tensors, micro_batch_size, max_token_len)
    parts: dict[str, list[Tensor]] = {}
    for index in indices:
        micro = to_device(tensors, index, device)
        scores = teacher_scores(module, micro, response_length, remove_padding, fused, topk, 1.0, share_prompts)
        if topk is not None:
            scores.pop("log_probs")  # the top-k loss reads only the top-k
        for name, value in scores.items():
            parts.setdefault(STEP_KEYS[name], []).append(value)
    return {name: restore_order(values, indices) for name, values in parts.items()}


def route_rows(keys: Mapping[str, str], column: np.ndarray, column_name: str) -> dict[str, Tensor]:
    """Each teacher's rows (bool (B,)) by the rows' ``column`` values and the teachers' ``keys`` (name -> key);
    ValueError naming the values no teacher takes."""
    values = np.asarray(column).astype(str)
    unmatched = sorted(set(values.tolist()) - set(keys.values()))
    if unmatched:
        raise ValueError(
            f"rows with {column_name}={unmatched[:3]} have no teacher: distillation.teacher_models.<name>.key "
            f"are {sorted(keys.values())}"
        )
    return {name: torch.from_numpy(values == key) for name, key in keys.items()}


def merge_by_rows(scores: Mapping[str, dict[str, Tensor]], rows: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """One set of scores from each teacher's (``scores``: name -> key -> (B, R, ...)), each row its own teacher's."""
    first = next(iter(scores.values()))
    merged = {key: torch.zeros_like(value) for key, value in first.items()}
    for name, own in rows.items():
        for key, value in scores[name].items():
            merged[key][own] = value[own]
    return merged


def teacher_rows(data: DataProto, teachers: Mapping[str, Any], teacher_key: str) -> dict[str, Tensor] | None:
    """With several teachers, each one's rows of ``data`` (``route_rows``); None for a single teacher."""
    if len(teachers) == 1:
        return None
    if teacher_key not in data.non_tensor_batch:
        raise ValueError(
            f"distillation.teacher_key={teacher_key!r}: the rows have no such column to route them to "
            f"{len(teachers)} teachers (columns: {sorted(data.non_tensor_batch)})"
        )
    keys = {name: teacher.key for name, teacher in teachers.items()}
    return route_rows(keys, data.non_tensor_batch[teacher_key], f"distillation.teacher_key ({teacher_key})")
