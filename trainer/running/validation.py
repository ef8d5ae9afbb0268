"""Validation's bookkeeping: each validation batch's scored rows, collected into the per-source metrics
(``trainer.observing.metrics.validation_metrics``: ``val-core/<source>/reward/mean@n``, ``val-aux/...``) and the
generation dumps' parts (``trainer.observing.generations``). The driver generates and scores
(``RayPPOTrainer.validate``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from single_controller.data_proto import DataProto
from trainer.observing.metrics import validation_metrics

VAL_ROW_STATS = ("tool_call_counts",)  # multi-turn rollouts: val-aux/<source>/tool_call_counts/mean@n


@dataclass
class ValidationTally:
    """What one validation has scored so far; ``n`` responses a prompt, consecutive."""

    n: int
    sources: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    answers: list[tuple[int, ...]] = field(default_factory=list)
    extras: dict[str, list[float]] = field(default_factory=dict)
    parts: list[tuple[DataProto, Any, dict]] = field(default_factory=list)  # (batch, prompts, extras): the dumps'
    errors: dict[str, int] = field(default_factory=dict)  # responses the reward function failed on, by reason

    def add(self, batch: DataProto, prompts: Any, reward: torch.Tensor, reward_extras: dict[str, list]) -> None:
        """A scored batch: ``reward`` (B, R) token-level scores, ``reward_extras`` the reward function's per-row
        values; ``prompts`` (input ids, attention mask) as given to the rollout."""
        batch.batch["token_level_scores"] = reward
        self.parts.append((batch, prompts, {"reward": reward.sum(-1).tolist(), **reward_extras}))
        rows = {k: list(batch.non_tensor_batch[k]) for k in VAL_ROW_STATS if k in batch.non_tensor_batch}
        for key, values in {**reward_extras, **rows}.items():  # e.g. a flexible score beside the strict one
            if key != "score" and len(values) == len(batch) and all(isinstance(v, (int, float)) for v in values):
                self.extras.setdefault(key, []).extend(values)
        self.sources += [str(source) for source in batch.non_tensor_batch["data_source"]]
        self.rewards += reward.sum(-1).tolist()
        self.answers += [
            tuple(ids[mask.bool()].tolist())
            for ids, mask in zip(batch.batch["responses"], batch.batch["response_mask"])
        ]

    def count_errors(self, reasons: dict[str, int]) -> None:
        """The last batch's reward failures by reason (scored 0: ``RewardManager.last_error_reasons``)."""
        for reason, count in reasons.items():
            self.errors[reason] = self.errors.get(reason, 0) + count

    def metrics(self) -> dict[str, float]:
        """The validation metrics, and ``val-aux/reward/errors/<reason>`` where the reward function failed."""
        errors = {f"val-aux/reward/errors/{reason}": count for reason, count in self.errors.items()}
        return {**validation_metrics(self.sources, self.rewards, self.answers, self.n, self.extras), **errors}
