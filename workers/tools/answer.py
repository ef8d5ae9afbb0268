"""An answer-checking tool for GSM8K (``calc_gsm8k_reward``): the model submits an answer,
the tool says if it is right.

Each call's instance gets the row's ground truth from ``extra_info.tools_kwargs.calc_gsm8k_reward.
create_kwargs.ground_truth`` (the layout ``data.preprocess.gsm8k_tools`` writes). The answer is right when its
last number equals the ground truth as a number (GSM8K's flexible extraction). The step
reward is 0 for a submission that improves on the trajectory's previous one and -0.05 otherwise (a penalty on
resubmitting): instances live for one call (``workers.tools.base``), so the trajectory's previous submission is kept in
``agent_data.extra_fields``. ``calc_reward`` is 1 for a right submission, else 0; the trajectory's last one
reaches the reward function as ``extra_info["rollout_reward_scores"]["calc_gsm8k_reward"]``.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from workers.tools.base import BaseTool, ToolResponse

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
RESUBMIT_PENALTY = -0.05


def _last_number(text: str) -> float | None:
    found = _NUMBER.findall(text.replace("$", ""))
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def is_correct(answer: str, ground_truth: Any) -> bool:
    """The last number in ``answer`` equals ``ground_truth`` (commas and ``$`` ignored)."""
    value, truth = _last_number(str(answer)), _last_number(str(ground_truth))
    return value is not None and truth is not None and value == truth


class AnswerTool(BaseTool):
    default_schema = {
        "type": "function",
        "function": {
            "name": "calc_gsm8k_reward",
            "description": "Submit your final answer to the question and learn whether it is correct.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string", "description": "the answer, a number"}},
                "required": ["answer"],
            },
        },
    }

    def __init__(self, config: dict, tool_schema: Any = None) -> None:
        super().__init__(config, tool_schema)
        self._instances: dict[str, dict[str, Any]] = {}

    def create(
        self, instance_id: str | None = None, create_kwargs: dict | None = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        instance_id = instance_id or uuid.uuid4().hex
        ground_truth = (create_kwargs or {}).get("ground_truth", kwargs.get("ground_truth"))
        self._instances[instance_id] = {"ground_truth": ground_truth, "reward": 0.0}
        return instance_id, ToolResponse()

    def execute(
        self, instance_id: str, parameters: dict[str, Any], agent_data: Any = None, **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        state = self._instances[instance_id]
        answer = str(parameters.get("answer", ""))
        reward = float(is_correct(answer, state["ground_truth"]))
        # the trajectory's previous submission (the instance's own when called outside an agent loop)
        previous = agent_data.extra_fields.setdefault(self.name, {"reward": 0.0}) if agent_data is not None else state
        step_reward = 0.0 if reward > previous["reward"] else RESUBMIT_PENALTY
        state["reward"] = previous["reward"] = reward
        verdict = "correct" if reward else "incorrect"
        return ToolResponse(text=f"Your answer {answer!r} is {verdict}."), step_reward, {}

    def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return self._instances[instance_id]["reward"]

    def release(self, instance_id: str, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)
