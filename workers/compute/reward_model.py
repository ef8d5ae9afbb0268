"""A learned reward model on one data-parallel rank: one scalar score per sequence, placed on its last token.

The model is an HF ``*ForSequenceClassification`` checkpoint with one label. Its own pooling takes the
rightmost token that is not the pad id, which is wrong when a response ends in a token equal to the pad id
(e.g. an EOS that doubles as pad); so the score is read from the per-token head output at the last
*attended* token instead. The RM reads the policy's token ids, so it must share the policy's tokenizer.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import AutoModelForSequenceClassification

from planner.phases import SEQUENCE
from single_controller.data_proto import DataProto
from workers.compute.update import model_device


def load_reward_model(path: str) -> nn.Module:
    """fp32 sequence-classification model with one output (the score), in eval mode, frozen.

    A checkpoint without a trained one-output ``score`` head (e.g. a plain causal LM) is refused: its head
    would be random. (A head of another size already fails to load.)
    """
    model, info = AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=1, dtype=torch.float32, output_loading_info=True
    )
    if not isinstance(getattr(model, "score", None), nn.Linear):
        raise ValueError(f"reward model {path}: {type(model).__name__} has no linear `score` head to read")
    if any(key.startswith("score.") for key in info["missing_keys"]):
        raise ValueError(f"reward model {path}: the checkpoint has no `score` head, so it is not a trained RM")
    return model.requires_grad_(False).eval()


def sequence_scores(module: nn.Module, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> Tensor:
    """(B,) fp32 score of each row: the ``score`` head's output at the row's last attended token."""
    per_token: list[Tensor] = []
    hook = module.score.register_forward_hook(lambda _m, _args, out: per_token.append(out))
    try:
        module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    finally:
        hook.remove()
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)
    last = (attention_mask * positions).argmax(-1)  # the rightmost attended position
    return per_token[0][torch.arange(input_ids.shape[0], device=input_ids.device), last, 0].float()


@torch.no_grad()
def compute_rm_scores(module: nn.Module, data: DataProto, micro_batch_size: int) -> Tensor:
    """rm_scores (B, R) on CPU: each row's score at its last valid response token, 0 elsewhere.

    Needs input_ids, attention_mask, position_ids, response_mask. A row with an empty response scores 0
    (it has no token to carry the score, as with the rule-based reward).
    """
    score = device_sequence_scores(module, data, micro_batch_size).cpu()  # one copy from the device per call
    response_mask = data.batch["response_mask"]
    # the last real token: with tool calls the response mask has holes where tool turns are
    lengths = data.batch["attention_mask"][:, -response_mask.shape[-1] :].sum(-1).long()
    rm_scores = torch.zeros(response_mask.shape, dtype=torch.float32)
    rows = torch.nonzero(lengths > 0).squeeze(-1)
    rm_scores[rows, lengths[rows] - 1] = score[rows]
    return rm_scores


def device_sequence_scores(module: nn.Module, data: DataProto, micro_batch_size: int) -> Tensor:
    """(B,) :func:`sequence_scores` of every row, in micro-batches, on the module's device. Token ids outside the
    reward model's vocabulary are a ValueError, checked on the batch's CPU tensors (no read from the device)."""
    largest = int(data.batch["input_ids"].max())
    if largest >= module.config.vocab_size:
        raise ValueError(
            f"token id {largest} is outside the reward model's vocabulary ({module.config.vocab_size}); "
            "the reward model must use the policy's tokenizer"
        )
    device = model_device(module)
    scores = []
    for start in range(0, len(data), micro_batch_size):
        micro = {k: data.batch[k][start : start + micro_batch_size].to(device) for k in SEQUENCE}
        scores.append(sequence_scores(module, **micro))
    return torch.cat(scores)
