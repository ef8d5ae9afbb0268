"""Tools without a model: the safe calculator, the answer checker, hermes parsing, verl's tool YAML, function
tools, user tool files, and a hung or raising tool's call ending with a message."""

import time

import pytest

from config.roles import MultiTurnConfig
from workers.tools import ToolBox, ToolConfigError, ToolSession, load_tools
from workers.tools.answer import AnswerTool
from workers.tools.calculator import CalculatorError, CalculatorTool, calculate
from workers.tools.parser import ToolCall, parse_tool_calls
from workers.tools.runner import run_all, truncate


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
    tool = AnswerTool({})
    instance = tool.create(create_kwargs={"ground_truth": "1,200"})
    assert tool.execute(instance, {"answer": "41"})[1:] == (-0.05, {})  # a wrong submission is penalised
    text, step, _ = tool.execute(instance, {"answer": "so #### $1200"})
    assert "is correct" in text.text and step == 0.0 and tool.calc_reward(instance) == 1.0
    assert tool.execute(instance, {"answer": "1200"})[1] == -0.05  # no improvement on a right answer
    tool.release(instance)
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


def test_run_all_returns_values_errors_and_timeouts_without_waiting_for_a_hung_call():
    def hang():
        time.sleep(5)

    async def coroutine():
        return "async"

    start = time.perf_counter()
    outcomes = run_all([lambda: 1, lambda: 1 / 0, hang, coroutine], timeout_s=0.3)
    assert time.perf_counter() - start < 2
    assert outcomes[0].value == 1 and outcomes[3].value == "async"
    assert outcomes[1].error == "ZeroDivisionError: division by zero"
    assert "did not answer within 0.3 s" in outcomes[2].error


@pytest.mark.parametrize(
    "side, expected",
    [("left", "abcd...(truncated)"), ("right", "(truncated)...ghij"), ("middle", "ab...(truncated)...ij")],
)
def test_tool_responses_are_truncated_on_verls_side(side, expected):
    assert truncate("abcdefghij", 4, side) == expected and truncate("abc", 4, side) == "abc"


TOOLS_YAML = """tools:
  - class_name: workers.tools.calculator.CalculatorTool
    config: {type: native}
  - class_name: {path}:CounterTool
    config: {type: native, start: 5}
  - class_name: verl.tools.gsm8k_tool.Gsm8kTool
    config: {type: native}
"""
USER_TOOLS = """
from workers.tools import BaseTool

class CounterTool(BaseTool):
    default_schema = {"type": "function", "function": {"name": "counter", "description": "counts"}}

    def create(self, instance_id=None, **kwargs):
        return "only"

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
'''


def test_verls_tool_yaml_user_classes_and_function_tools_load_and_run(tmp_path):
    (tmp_path / "user_tools.py").write_text(USER_TOOLS)
    (tmp_path / "functions.py").write_text(FUNCTIONS)
    (tmp_path / "tools.yaml").write_text(TOOLS_YAML.replace("{path}", str(tmp_path / "user_tools.py")))
    tools = load_tools(str(tmp_path / "tools.yaml"), str(tmp_path / "functions.py"))
    assert sorted(tools) == ["add", "calc_gsm8k_reward", "calculator", "counter", "shout"]
    assert tools["add"].tool_schema.function.parameters["required"] == ["a", "b"]
    box = ToolBox(tools, MultiTurnConfig(enable=True))
    session = ToolSession()
    calls = [ToolCall("add", {"a": 2, "b": 3}), ToolCall("shout", {"text": "hi"}), ToolCall("counter")]
    assert box.run_turn([(session, calls[:1]), (ToolSession(), calls[1:2])]) == [['{"sum": 5}'], ["HI"]]
    assert box.run_turn([(session, [calls[2]])]) == [["6"]] and session.step_reward == 0.5
    assert box.run_turn([(session, [ToolCall("add", {"c": 1})])])[0][0].startswith(
        "Error: the tool 'add' failed: TypeError"
    )
    box.finish([session])
    assert session.reward_scores == {"add": 0.0, "counter": 0.0} and session.errors == 1 and session.calls == 3


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
