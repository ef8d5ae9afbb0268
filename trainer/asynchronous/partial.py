"""Partial rollouts (``trainer.v1.trainer_mode=colocate_async``): a step's generation stops once a batch of prompt
groups has ended; the rows still decoding wait and go on at the next step, under the weights trained meanwhile.

The rollout is a batch decode loop, so a step generates one piece of every row not ended; a row still decoding
goes on at the next step, its tokens so far part of its prompt:

1. the step's drawn batch (at the first step, ``num_warmup_batches`` more) joins the ``Pool`` of rows in flight;
2. one piece of generation runs over every row not ended: its prompt followed by its tokens so far, with what is
   left of ``response_length`` as its budget, until ``train_batch_size`` groups have ended
   (``workers.compute.decode_loop.Partial``), so the decode steps run on the pool's rows, not on one batch's tail;
3. the oldest ended groups train; the others stay, their tokens and log-probs kept.

Each row carries the first and the last version of the weights that generated it. A group that generates at step
``s`` spans the versions from its first to ``s - 1``: ``drop`` evicts one whose span would pass
``max_off_policy_threshold`` (and draws fresh prompts), ``wait`` has the piece wait for its rows to end.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor

from planner.phases import PROMPT
from single_controller.data_proto import DataProto
from single_controller.padding import pad_dataproto_to_divisor
from trainer.asynchronous.replay_buffer import FIRST_VERSION, VERSION, eviction_stats
from trainer.observing.metrics import reduce_metrics
from trainer.running.routing import STEP_TOKEN
from workers.compute.decode_loop import rollout_batch
from workers.compute.rollout import PARTIAL_KEYS, QUOTA

TOKENS, LOG_PROBS, LENGTH, ENDED = "partial_tokens", "partial_log_probs", "partial_length", "partial_ended"
FIRST, LAST = "partial_first", "partial_last"
STATE = (TOKENS, LOG_PROBS, LENGTH, ENDED, FIRST, LAST)  # the pool's own tensors of each row


def continuation(prompt: tuple[Tensor, ...], tokens: Tensor, length: Tensor) -> tuple[Tensor, ...]:
    """The rows to continue, left-padded: each prompt (ids, mask, positions (N, P)) followed by its first
    ``length`` (N,) of ``tokens`` (N, R), positions continuing the prompt's; as wide as the longest."""
    ids, mask, positions = prompt
    offsets = torch.arange(1, tokens.shape[1] + 1, dtype=positions.dtype)
    so_far = (torch.arange(tokens.shape[1]) < length[:, None]).to(mask.dtype)
    ids, mask = torch.cat([ids, tokens], -1), torch.cat([mask, so_far], -1)
    positions = torch.cat([positions, positions[:, -1:] + offsets], -1)
    order = torch.argsort(mask, dim=-1, stable=True)  # padding first, then the tokens in their order
    width = int(mask.sum(-1).max())
    return tuple(x.gather(-1, order)[:, -width:] for x in (ids, mask, positions))


def append(state: Any, index: Tensor, out: Any, version: int) -> None:
    """Into the pool's rows ``index`` (``state``: their tensors), a piece's answer ``out`` (responses,
    response_mask, ended; rollout_log_probs when computed): the new tokens after those so far, by ``version``."""
    counts = out["response_mask"].sum(-1)
    for row, i in enumerate(index.tolist()):
        start, n = int(state[LENGTH][i]), int(counts[row])
        state[TOKENS][i, start : start + n] = out["responses"][row, :n]
        if "rollout_log_probs" in out.keys():
            state[LOG_PROBS][i, start : start + n] = out["rollout_log_probs"][row, :n]
    state[FIRST][index] = torch.where(state[LENGTH][index] == 0, version, state[FIRST][index])
    state[LAST][index] = version
    state[LENGTH][index] += counts
    state[ENDED][index] = out["ended"].bool()


class Pool:
    """The rows in flight of ``colocate_async``'s partial rollouts, generated on ``group`` (the trainer's)."""

    def __init__(self, cfg: Any, mode: Any, group: Any, pad_token_id: int) -> None:
        self.group, self.pad = group, pad_token_id
        self.prompts = cfg.data.train_batch_size  # the groups a step trains on
        self.in_flight = (1 + mode.lookahead) * self.prompts  # groups in the pool when a step generates
        self.threshold, self.strategy = mode.max_off_policy_threshold, mode.max_off_policy_strategy
        self.response_length = int(cfg.actor_rollout_ref.rollout.response_length)
        self.rows: DataProto | None = None

    def next(
        self,
        batch: DataProto,
        more: Iterator[DataProto],
        step: int,
        version: int,
        seed: Callable[[], int],
        generating: Any,
    ) -> tuple[DataProto, dict[str, float]]:
        """Add ``batch`` (repeated, ready to generate from, as ``more`` gives them), evict what ``drop`` must (the
        rows to ``generating.dropped``), draw from ``more`` until the pool holds its groups, and generate with the
        weights of ``version`` until ``train_batch_size`` groups have ended (each piece under ``seed()``); the
        oldest of them as the step's batch (the keys the rollout ``generating.writes``), and the metrics."""
        self.add(batch)
        evicted = self._evict(step, generating.dropped)
        while self._groups(self.rows) < self.in_flight:
            self.add(next(more))
        metrics: dict[str, float] = {}
        while (piece := self._piece(step)) is not None:
            index, sent = piece
            sent.meta_info["seed"] = seed()
            out = self.group.generate_sequences(sent)
            for name, value in reduce_metrics(out.meta_info.pop("metrics", {})).items():  # the pieces' times add up
                metrics[name] = metrics.get(name, 0.0) + value if name.startswith("timing_s/") else value
            append(self.rows.batch, index, out[: len(index)].batch, version)
        return self._take(generating.writes), {**metrics, **evicted}

    def add(self, batch: DataProto) -> None:
        """``batch``'s rows join the pool, nothing generated yet (groups are taken in the order they joined)."""
        n, zeros = len(batch), torch.zeros(len(batch), dtype=torch.long)
        state = {
            TOKENS: torch.full((n, self.response_length), self.pad, dtype=torch.long),
            LOG_PROBS: torch.zeros(n, self.response_length),
            LENGTH: zeros,
            ENDED: torch.zeros(n, dtype=torch.bool),
            FIRST: zeros.clone(),
            LAST: zeros.clone(),
        }
        rows = DataProto.from_dict({**batch.batch, **state}, dict(batch.non_tensor_batch))
        self.rows = rows if self.rows is None else DataProto.concat([self.rows, rows])

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _groups(rows: DataProto | None) -> int:
        return 0 if rows is None else len(np.unique(rows.non_tensor_batch["uid"]))

    def _group_of(self) -> np.ndarray:
        """Each row's group (its prompt's ``uid``) as a number, the groups numbered in the order they joined."""
        _, first, inverse = np.unique(self.rows.non_tensor_batch["uid"], return_index=True, return_inverse=True)
        order = np.argsort(first)
        number = np.empty_like(order)
        number[order] = np.arange(len(order))
        return number[inverse]

    def _group_spans(self, step: int, group: np.ndarray) -> Tensor:
        """Each row's group's span if it generates at ``step``: versions from its group's first to ``step - 1``
        (``group``: each row's, ``_group_of``)."""
        state, group = self.rows.batch, torch.as_tensor(group)
        first = torch.where(state[LENGTH] > 0, state[FIRST], step - 1)
        oldest = torch.full((int(group.max()) + 1,), step - 1).scatter_reduce(0, group, first, "amin")
        return step - oldest[group]

    def _evict(self, step: int, dropped: Callable[[DataProto], None]) -> dict[str, float]:
        """``drop``: the groups still generating whose span would pass the threshold leave the pool (an
        eviction), given to ``dropped``; their spans' metrics."""
        if self.strategy != "drop" or self.threshold is None or self.rows is None:
            return {}
        group = self._group_of()
        spans = self._group_spans(step, group).numpy()
        stale = np.unique(group[~self.rows.batch[ENDED].numpy() & (spans > self.threshold)])
        if not len(stale):
            return {}
        out = np.isin(group, stale)
        dropped(self.rows[np.flatnonzero(out)])
        self.rows = self.rows[np.flatnonzero(~out)]
        return eviction_stats(np.array([spans[group == g][0] for g in stale]))

    def _piece(self, step: int) -> tuple[Tensor, DataProto] | None:
        """The next piece to generate (the pool's indices of its rows, what goes to the workers), or None once
        ``train_batch_size`` groups have ended and no row that must end this step (``wait``) is still open."""
        state = self.rows.batch
        group = self._group_of()
        ended = state[ENDED].numpy()
        complete = self._groups(self.rows) - len(np.unique(group[~ended]))
        required = ~state[ENDED]
        if self.strategy != "wait" or self.threshold is None:
            required = torch.zeros_like(required)
        else:  # rows of a group that, generating again at the next step, would span past the threshold
            required &= self._group_spans(step, group) + 1 > self.threshold
        if complete >= self.prompts and not required.any():
            return None
        index = torch.as_tensor(np.flatnonzero(~ended))
        prompt = tuple(state[k][index] for k in PROMPT)
        ids, mask, positions = continuation(prompt, state[TOKENS][index], state[LENGTH][index])
        tensors = dict(zip(PROMPT, (ids, mask, positions), strict=True))
        budget = self.response_length - state[LENGTH][index]
        tensors.update(zip(PARTIAL_KEYS, (budget, torch.as_tensor(group)[index], required[index]), strict=True))
        world = self.group.world_size
        quota = -(-max(0, self.prompts - complete) // world)  # each rank its share of the groups still wanted
        sent, _ = pad_dataproto_to_divisor(DataProto.from_dict(tensors, meta_info={QUOTA: quota}), world)
        return index, sent

    def _take(self, writes: tuple[str, ...]) -> DataProto:
        """The oldest ``train_batch_size`` groups that have ended, as the rollout writes its batch; they leave."""
        group = self._group_of()
        open_groups = group[~self.rows.batch[ENDED].numpy()]
        chosen = np.setdiff1d(group, open_groups)[: self.prompts]  # group numbers follow the order they joined in
        taken = np.isin(group, chosen)
        batch, self.rows = self.rows[np.flatnonzero(taken)], self.rows[np.flatnonzero(~taken)]
        tensors = dict(batch.batch.items())
        length = tensors[LENGTH]
        response_mask = (torch.arange(self.response_length) < length[:, None]).to(tensors["attention_mask"].dtype)
        prompt = (tensors[k] for k in PROMPT)
        tensors.update(rollout_batch(*prompt, tensors[TOKENS], response_mask))
        log_probs = tensors[LOG_PROBS]
        tensors.update({k: log_probs for k in ("rollout_log_probs", "old_log_probs") if k in writes})
        columns = {**batch.non_tensor_batch, VERSION: tensors[LAST].numpy(), FIRST_VERSION: tensors[FIRST].numpy()}
        for key in STATE:
            tensors.pop(key)
        return DataProto.from_dict(tensors, columns, meta_info={STEP_TOKEN: uuid.uuid4().hex})
