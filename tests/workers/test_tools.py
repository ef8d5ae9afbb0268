"""Tools without a model: the safe calculator, the answer checker, hermes parsing, verl's tool YAML, function
tools, user tool files, the worker's event loop (a hung or raising tool's call ending with a message, a lock held
across calls). Tool files written for verl: tests/verl_compat/test_tool_files.py."""

import asyncio
import time
from pathlib import Path

import pytest

from config.sections import MultiTurnConfig
from workers.tools import AgentData, BaseTool, ToolBox, ToolConfigError, load_tools
from workers.tools.answer import AnswerTool
from workers.tools.calculator import CalculatorError, CalculatorTool, calculate
from workers.tools.parser import ToolCall, parse_tool_calls
from workers.tools.runner import ToolLoop, call_tool_method, truncate

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "expression, value",
    [
        ("1+2", "3"),
        ("(12 + 30) * 2", "84"),
        ("7/2", "3.5"),
        ("8/4", "2"),
        ("2**10", "1024"),
        ("-3 - -4", "1"),
        ("17 // 5 + 17 % 5", "5"),
        ("1/3", "0.3333333333"),
    ],
)
def test_the_calculator_computes_arithmetic(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize(
    "expression, message",
    [
        ("__import__('os').system('true')", "Call is not allowed"),
        ("x + 1", "Name is not allowed"),
        ("'a' * 3", "Constant"),
        ("(1).real", "Attribute is not allowed"),
        ("9**9**9", "exponent"),
        ("10**16", "too large"),
        ("99999999 * 99999999", "too large"),
        ("1/0", "division by zero"),
        ("2^3", "use ** for powers"),
        ("1 +", "cannot parse"),
        ("1" * 201, "longer than 200"),
        ("+".join(["1"] * 60), "more than 100 parts"),
        ("(-8) ** 0.5", "fractional power"),
        ("", "non-empty"),
    ],
)
def test_the_calculator_refuses_anything_else_before_computing_it(expression, message):
    start = time.perf_counter()
    with pytest.raises(CalculatorError, match=message.replace("(", r"\(").replace("*", r"\*")):
        calculate(expression)
    assert time.perf_counter() - start < 0.1  # bounds are checked before the work, not after


def test_the_calculators_result_template_shapes_its_turn_and_errors_stay_errors():
    plain, reminded = CalculatorTool({}), CalculatorTool({"result_template": "{result}, so: #### {result}"})
    assert plain.execute("i", {"expression": "40+2"})[0].text == "42"
    assert reminded.execute("i", {"expression": "40+2"})[0].text == "42, so: #### 42"
    response, _, info = reminded.execute("i", {"expression": "40+"})
    assert response.text.startswith("Error: cannot parse") and info == {"error": 1}


def test_the_answer_tool_is_verls_gsm8k_tool():
    """An instance per call (verl 0.9): the resubmission penalty compares with the trajectory's previous
    submission, kept in agent_data.extra_fields."""
    tool, agent_data = AnswerTool({}), AgentData()

    def submit(answer):
        instance, _ = tool.create(create_kwargs={"ground_truth": "1,200"})
        text, step, _ = tool.execute(instance, {"answer": answer}, agent_data=agent_data)
        score = tool.calc_reward(instance)
        tool.release(instance)
        return text.text, step, score

    assert submit("41")[1:] == (-0.05, 0.0)  # a wrong submission is penalised
    text, step, score = submit("so #### $1200")
    assert "is correct" in text and step == 0.0 and score == 1.0
    assert submit("1200")[1:] == (-0.05, 1.0)  # no improvement on a right answer
    assert not tool._instances


def test_hermes_parsing_keeps_every_attempted_call():
    text = (
        'think <tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> <tool_call>{"name": "b", '
        '"arguments": "{\\"y\\": 2}"}</tool_call><tool_call>[1]</tool_call><tool_call>{"name": "c", '
        '"arguments": 3}</tool_call><tool_call>{"name": "d"'
    )
    calls = parse_tool_calls(text)
    assert calls[:2] == [ToolCall("a", {"x": 1}), ToolCall("b", {"y": 2})]  # arguments as a JSON string too
    assert [c.error is not None for c in calls] == [False, False, True, True, True]
    assert "not closed" in calls[4].error and parse_tool_calls("#### 4") == []


def test_the_tool_loop_returns_values_errors_and_timeouts_without_waiting_for_a_hung_call():
    loop = ToolLoop()

    async def value():
        return 1

    async def raises():
        raise ValueError("broken")

    async def awaits_forever():  # an async tool: cancelled at its deadline
        return await call_tool_method(asyncio.Event().wait, 0.3)

    async def blocks():  # a plain def tool: runs in a thread of its own, abandoned at its deadline
        return await call_tool_method(time.sleep, 0.3, 5)

    start = time.perf_counter()
    outcomes = loop.run([value, raises, awaits_forever, blocks, lambda: call_tool_method(lambda: "sync", 1)], 5.0)
    assert time.perf_counter() - start < 2
    assert outcomes[0].value == 1 and outcomes[4].value == "sync"
    assert outcomes[1].error == "ValueError: broken"
    assert outcomes[2].error == outcomes[3].error == "the tool did not answer within 0.3 s"

    async def blocks_the_loop():  # async def that never awaits: it holds up every call on the loop
        time.sleep(1.5)

    first = loop.loop
    outcomes = loop.run([blocks_the_loop, value], 0.5)
    assert all("its event loop was blocked" in o.error for o in outcomes)
    assert loop.loop is not first and loop.run([value], 1.0)[0].value == 1  # a fresh loop takes over


class LockedTool(BaseTool):
    """Holds one asyncio.Lock, made outside any event loop, across all its calls (a client session would)."""

    default_schema = {"type": "function", "function": {"name": "locked", "description": "one call at a time"}}

    def __init__(self, config, tool_schema=None):
        super().__init__(config, tool_schema)
        self.lock, self.inside, self.most = asyncio.Lock(), 0, 0

    async def execute(self, instance_id, parameters, **kwargs):
        async with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
            await asyncio.sleep(0.01)
            self.inside -= 1
        return "ok"


def test_a_tool_holding_an_asyncio_lock_across_calls_works():
    tool = LockedTool({})
    box = ToolBox({"locked": tool}, MultiTurnConfig(enable=True, max_parallel_calls=4))
    for _ in range(2):  # two turns: the same loop, the same lock
        rows = [(AgentData(), [ToolCall("locked")] * 2) for _ in range(3)]
        assert box.run_turn(rows) == [["ok", "ok"]] * 3
        assert all(agent_data.error_count == 0 for agent_data, _ in rows)
    assert tool.most == 1  # the lock did its work


@pytest.mark.parametrize(
    "side, expected",
    [("left", "(truncated)...ghij"), ("right", "abcd...(truncated)"), ("middle", "ab...(truncated)...ij")],
)
def test_tool_responses_are_truncated_on_verls_side(side, expected):
    assert truncate("abcdefghij", 4, side) == expected and truncate("abc", 4, side) == "abc"


TOOLS_YAML = """tools:
  - class_name: workers.tools.calculator.CalculatorTool
    config: {type: native}
  - class_name: {path}:CounterTool
    config: {type: native, start: 5}
  - class_name: workers.tools.answer.AnswerTool
    config: {type: native}
"""
USER_TOOLS = """
from workers.tools import BaseTool

class CounterTool(BaseTool):
    default_schema = {"type": "function", "function": {"name": "counter", "description": "counts"}}

    def create(self, instance_id=None, **kwargs):
        return "only"  # just an id: accepted as well as verl's (id, response)

    def execute(self, instance_id, parameters, **kwargs):
        self.config["start"] += 1
        return str(self.config["start"]), 0.5
"""
FUNCTIONS = '''
from workers.tools import function_tool

@function_tool
def add(a: int, b: int) -> dict:
    """Add two numbers.

    Args:
        a: the first
        b: the second
    """
    return {"sum": a + b}

@function_tool("shout")
async def loud(text: str) -> str:
    """Shout.

    Args:
        text: what to shout
    """
    return text.upper()

@function_tool
def judge(text: str) -> tuple:
    """Judge an answer.

    Args:
        text: the answer
    """
    return f"seen {text}", text == "yes"  # a bool step reward, as verl's function tools may give
'''


def test_verls_tool_yaml_user_classes_and_function_tools_load_and_run(tmp_path):
    (tmp_path / "user_tools.py").write_text(USER_TOOLS)
    (tmp_path / "functions.py").write_text(FUNCTIONS)
    (tmp_path / "tools.yaml").write_text(TOOLS_YAML.replace("{path}", str(tmp_path / "user_tools.py")))
    tools = load_tools(str(tmp_path / "tools.yaml"), str(tmp_path / "functions.py"))
    assert sorted(tools) == ["add", "calc_gsm8k_reward", "calculator", "counter", "judge", "shout"]
    assert tools["add"].tool_schema.function.parameters.required == ["a", "b"]
    box = ToolBox(tools, MultiTurnConfig(enable=True))
    agent_data = AgentData()
    calls = [ToolCall("add", {"a": 2, "b": 3}), ToolCall("shout", {"text": "hi"}), ToolCall("counter")]
    assert box.run_turn([(agent_data, calls[:1]), (AgentData(), calls[1:2])]) == [['{"sum": 5}'], ["HI"]]
    assert box.run_turn([(agent_data, [calls[2]])]) == [["6"]] and agent_data.tool_rewards == [0.0, 0.5]
    assert box.run_turn([(agent_data, [ToolCall("add", {"c": 1})])])[0][0].startswith(
        "Error: the tool 'add' failed: TypeError"
    )
    assert agent_data.reward_scores == {"counter": 0.0} and agent_data.error_count == 1
    assert agent_data.call_count == 3
    judged = AgentData()
    texts = [box.run_turn([(judged, [ToolCall("judge", {"text": answer})])]) for answer in ("yes", "no")]
    assert texts == [[["seen yes"]], [["seen no"]]] and judged.tool_rewards == [1.0, 0.0] and not judged.error_count


@pytest.mark.parametrize(
    "yaml_text, message",
    [
        ("tools: 3", "expected a top-level 'tools:' list"),
        ("tools:\n  - class_name: no.such.Module\n", "cannot import 'no.such'"),
        ("tools:\n  - class_name: workers.tools.calculator.Nope\n", "has no class 'Nope'"),
        ("tools:\n  - class_name: workers.tools.calculator.CalculatorTool\n    config: {type: mcp}\n", "only native"),
        ("tools:\n  - class_name: workers.tools.base.BaseTool\n", "no tool_schema"),
        (
            "tools:\n  - class_name: workers.tools.calculator.CalculatorTool\n    tool_schema: {function: {}}\n",
            "function.name",
        ),
        (
            "tools:\n  - class_name: workers.tools.calculator.CalculatorTool\n"
            "  - class_name: workers.tools.calculator.CalculatorTool\n",
            "two tools are named 'calculator'",
        ),
        ("tools: [", "not valid YAML"),
    ],
)
def test_a_bad_tool_config_is_one_line_naming_the_problem(tmp_path, yaml_text, message):
    (tmp_path / "tools.yaml").write_text(yaml_text)
    with pytest.raises(ToolConfigError, match=message):
        load_tools(str(tmp_path / "tools.yaml"), None)


def arith_calculator_template() -> str:
    """The benchmark calculator's ``result_template`` (conf/tools/arith_calculator.yaml)."""
    import yaml

    path = Path(__file__).resolve().parents[2] / "conf/tools/arith_calculator.yaml"
    (tool,) = yaml.safe_load(path.read_text())["tools"]
    return tool["config"]["result_template"]


def test_the_arithmetic_calculators_tool_turn_never_scores_by_itself():
    """The reward reads tool turns too: the benchmark calculator's reminder must not hold a scorable answer."""
    from data.rewards.arith import compute_score

    turn = arith_calculator_template().format(result="44")
    assert "44" in turn  # the result itself is there
    assert compute_score("colorl/arith", f"Let me compute. {turn}", "44")["score"] == 0.0


def test_the_tools_preset_keeps_the_calculators_turn_whole():
    """A cut reminder ("...(truncated)...th #### followed by this number.") is not the turn the preset means."""
    from planner import load_config

    multi_turn = load_config([], config_name="smollm2_tools").actor_rollout_ref.rollout.multi_turn
    longest = arith_calculator_template().format(result=-99 * 99 * 99)  # beyond any two-step problem's
    cut = truncate(longest, multi_turn.max_tool_response_length, multi_turn.tool_response_truncate_side)
    assert cut == longest
