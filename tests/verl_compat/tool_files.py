"""Tool files as a verl 0.9 user writes them (they import ``verl.*``), and one exercise of them through ColoRL.

``python -m tests.verl_compat.tool_files DIR [--hide-verl]`` writes the files to DIR, loads and runs them, and
prints what happened as JSON; ``--hide-verl`` first makes Python's path finder blind to the installed verl package,
so the run is what it would be without verl.
"""

from __future__ import annotations

import importlib.machinery
import json
import sys
from pathlib import Path

# verl's GSM8K answer checker shape: async methods, state per instance, @rollout_trace_op, the schema built in
# code (get_openai_tool_schema) since the YAML gives none, agent_data read in execute
ANSWER_CHECKER = """
import re
from typing import Any, Optional
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.rollout_trace import rollout_trace_op


class AnswerChecker(BaseTool):
    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema):
        super().__init__(config, tool_schema)
        self._instances = {}

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return OpenAIFunctionToolSchema.model_validate(
            {
                "type": "function",
                "function": {
                    "name": "check_answer",
                    "description": "Check the answer to the question",
                    "parameters": {
                        "type": "object",
                        "properties": {"answer": {"type": "string", "description": "the answer"}},
                        "required": ["answer"],
                    },
                },
            }
        )

    async def create(self, instance_id: Optional[str] = None, **kwargs) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid4())
        ground_truth = kwargs.get("create_kwargs", {}).get("ground_truth")
        self._instances[instance_id] = {"answer": "", "ground_truth": ground_truth}
        return instance_id, ToolResponse()

    @rollout_trace_op
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        self._instances[instance_id]["answer"] = str(parameters.get("answer", ""))
        reward = await self.calc_reward(instance_id)
        turns = len(kwargs["agent_data"].messages)
        return ToolResponse(text=f"reward={reward} after {turns} messages"), 0.0 if reward else -0.05, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        state = self._instances[instance_id]
        numbers = re.findall(r"-?[0-9]+", state["answer"])
        return float(bool(numbers) and numbers[-1] == str(state["ground_truth"]))

    async def release(self, instance_id: str, **kwargs) -> None:
        del self._instances[instance_id]
"""
FUNCTIONS = '''
import asyncio

from verl.tools.function_tool import function_tool


@function_tool
def lookup_capital(country: str) -> dict:
    """Look up the capital of a country.

    Args:
        country: the country's name
    """
    return {"capital": {"france": "Paris"}.get(country.lower())}


@function_tool("multiply")
async def times(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    await asyncio.sleep(0)
    return a * b
'''
TOOLS_YAML = """tools:
  - class_name: {dir}/answer_checker.py:AnswerChecker
    config: {{type: native}}
  - class_name: workers.tools.calculator.CalculatorTool
    config: {{type: native}}
"""


def write(directory: Path) -> tuple[str, str]:
    """(tool YAML, function-tool file) in ``directory``."""
    (directory / "answer_checker.py").write_text(ANSWER_CHECKER)
    (directory / "functions.py").write_text(FUNCTIONS)
    (directory / "tools.yaml").write_text(TOOLS_YAML.format(dir=directory))
    return str(directory / "tools.yaml"), str(directory / "functions.py")


def verl_modules() -> list[str]:
    return sorted(name for name in sys.modules if name.split(".")[0] == "verl")


def exercise(directory: Path) -> dict:
    """Load ColoRL's own tools (which must not import verl), then the files (written once per directory), and run
    one turn with a call to each tool."""
    from config.sections import MultiTurnConfig
    from workers.tools import AgentData, ToolBox, load_tools
    from workers.tools.parser import ToolCall

    if not (directory / "tools.yaml").exists():
        write(directory)
    load_tools(str(Path(__file__).resolve().parents[2] / "conf/tools/calculator.yaml"), None)
    before = verl_modules()
    tools = load_tools(str(directory / "tools.yaml"), str(directory / "functions.py"))
    box = ToolBox(tools, MultiTurnConfig(enable=True, max_parallel_calls=4))
    agent_data = AgentData(
        messages=[{"role": "user", "content": "6*7?"}, {"role": "assistant", "content": "..."}],
        tools_kwargs={"check_answer": {"create_kwargs": {"ground_truth": "42"}}},
    )
    calls = [
        ToolCall("check_answer", {"answer": "#### 42"}),
        ToolCall("lookup_capital", {"country": "France"}),
        ToolCall("multiply", {"a": 6, "b": 7}),
        ToolCall("calculator", {"expression": "6*7"}),
    ]
    texts = box.run_turn([(agent_data, calls[:1]), (AgentData(), calls[1:])])
    checker = tools["check_answer"]
    return {
        "tools": sorted(tools),
        "schemas": box.schemas,
        "texts": texts,
        "reward_scores": agent_data.reward_scores,
        "tool_rewards": agent_data.tool_rewards,
        "released": not checker._instances,
        "bases": [f"{c.__module__}.{c.__name__}" for c in type(checker).__mro__[1:-1]],
        "schema_type": type(checker.tool_schema).__module__,
        "verl_modules_before": before,
        "verl_modules": verl_modules(),
    }


class _BlindToVerl:
    """Python's path finder, except that it finds no ``verl``: the process runs as if verl were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "verl" or name.startswith("verl."):
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)

    def invalidate_caches(self):
        importlib.machinery.PathFinder.invalidate_caches()

    def find_distributions(self, *args, **kwargs):  # package metadata (importlib.metadata) as before
        return importlib.machinery.PathFinder.find_distributions(*args, **kwargs)


if __name__ == "__main__":
    if "--hide-verl" in sys.argv:
        sys.meta_path[:] = [_BlindToVerl() if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
    print(json.dumps(exercise(Path(sys.argv[1]))))
