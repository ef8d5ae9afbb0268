"""Real rollout rows for the generation-dump and report tests: the multi-turn agent loop on a tiny model, its
assistant turns scripted (a calculator call, a failing call, a plain answer, a response cut at the limit)."""

from __future__ import annotations

import numpy as np
import torch

from algos.group_estimators import compute_grpo_outcome_advantage
from single_controller import DataProto
from tests.workers.agent_helpers import call, make_loop, objects, prompt_batch, run

RESPONSE_LENGTH = 200
QUESTIONS = ["q6*7", "q6*7", "q5", "q5"]
TURNS = [
    [call("calculator", expression="6*7"), "#### 42"],
    [call("nope", x=1), "#### 1"],  # an unknown tool: the tool's message is an error, the model answers after it
    ["#### 5"],
    ["1" * 300],  # cut at the response length
]
REWARDS = [1.0, 0.0, 1.0, 0.0]


def rollout_step(tokenizer, model) -> tuple[DataProto, tuple[torch.Tensor, torch.Tensor], dict[str, list]]:
    """(the step's batch after the advantages, the prompts' ids and mask (B, P), the reward function's extras) of one
    GRPO step over ``QUESTIONS`` (two prompt groups of two), as the driver holds them."""
    loop = make_loop(tokenizer)
    tensors, stats, _ = run(loop, model, tokenizer, QUESTIONS, TURNS, RESPONSE_LENGTH, return_log_probs=True)
    prompt = prompt_batch(tokenizer, QUESTIONS, loop.toolbox.schemas)
    prompts = prompt["input_ids"], prompt["attention_mask"]
    valid = tensors["attention_mask"][:, -RESPONSE_LENGTH:]
    scores = torch.zeros(len(QUESTIONS), RESPONSE_LENGTH)
    scores[torch.arange(len(QUESTIONS)), valid.sum(-1) - 1] = torch.tensor(REWARDS)
    uids = np.array(["a", "a", "b", "b"], dtype=object)
    advantages, _ = compute_grpo_outcome_advantage(scores, tensors["response_mask"].float(), uids)
    batch = DataProto.from_dict(
        {
            "responses": tensors["responses"],
            "attention_mask": tensors["attention_mask"],
            "response_mask": tensors["response_mask"],
            "rollout_log_probs": tensors["rollout_log_probs"],
            "token_level_scores": scores,
            "advantages": advantages,
        },
        non_tensors={
            **stats,
            "uid": uids,
            "data_source": objects(["colorl/arith"] * 4),
            "reward_model": objects([{"ground_truth": q[1:]} for q in ("q42", "q42", "q5", "q5")]),
        },
    )
    extras = {"score": list(REWARDS), "acc": [r > 0 for r in REWARDS]}
    return batch, prompts, extras
