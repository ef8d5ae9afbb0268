"""Tool files written for verl 0.9 (they import ``verl.*``) run unchanged through ColoRL's tool loader, with and
without the verl package (tests/verl_compat/tool_files.py writes and runs them in a fresh interpreter)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.verl_compat import tool_files

REPO = Path(__file__).resolve().parents[2]


EXPECTED_TEXTS = [["reward=1.0 after 2 messages"], ['{"capital": "Paris"}', "42", "42"]]


def run_verl_tool_files(directory: Path, *flags: str) -> dict:
    """tests.verl_compat.tool_files in a fresh interpreter (its imports are its own)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLORL_PRELOAD": "verl_compat.tools"}  # as main.py sets it
    done = subprocess.run(
        [sys.executable, "-m", "tests.verl_compat.tool_files", str(directory), *flags],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def verl_files(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("verl_tools")
    tool_files.write(directory)
    return directory


def test_verls_tool_files_run_unchanged_without_the_verl_package(verl_files):
    """verl hidden from Python's path finder: the files' verl.* imports get ColoRL's classes; verl's lifecycle,
    the schema from get_openai_tool_schema (the YAML has none), @function_tool with verl's import."""
    out = run_verl_tool_files(verl_files, "--hide-verl")
    assert out["tools"] == ["calculator", "check_answer", "lookup_capital", "multiply"]
    assert out["texts"] == EXPECTED_TEXTS and out["reward_scores"] == {"check_answer": 1.0}
    assert out["tool_rewards"] == [0.0] and out["released"] and out["verl_modules_before"] == []
    assert out["bases"] == ["workers.tools.base.BaseTool"] and out["schema_type"] == "workers.tools.base"
    assert out["verl_modules"] == ["verl", "verl.tools", "verl.tools.base_tool", "verl.tools.function_tool"] + [
        "verl.tools.schemas",
        "verl.utils",
        "verl.utils.rollout_trace",
    ]
    schema = next(s for s in out["schemas"] if s["function"]["name"] == "check_answer")
    assert schema["function"]["parameters"]["required"] == ["answer"]


def test_verls_tool_files_run_with_verls_own_classes_when_verl_is_installed(verl_files):
    pytest.importorskip("verl", reason="verl is not installed (make setup installs it for the tests)")
    out = run_verl_tool_files(verl_files)
    assert out["texts"] == EXPECTED_TEXTS and out["reward_scores"] == {"check_answer": 1.0} and out["released"]
    assert out["bases"] == ["verl.tools.base_tool.BaseTool"] and out["schema_type"] == "verl.tools.schemas"
    assert out["verl_modules_before"] == []  # ColoRL's own tools never import verl
    assert not any(name.startswith("verl.experimental") for name in out["verl_modules"])  # only what files import


def test_verls_former_gsm8k_tool_name_loads_colorls_answer_tool_once_the_door_is_imported(tmp_path):
    """verl's example tool configs name ``verl.tools.gsm8k_tool.Gsm8kTool``; the door maps it to the answer tool."""
    import verl_compat.tools  # noqa: F401  (what COLORL_PRELOAD imports)
    from workers.tools import load_tools
    from workers.tools.answer import AnswerTool

    (tmp_path / "tools.yaml").write_text("tools:\n  - class_name: verl.tools.gsm8k_tool.Gsm8kTool\n")
    tools = load_tools(str(tmp_path / "tools.yaml"), None)
    assert list(tools) == ["calc_gsm8k_reward"] and type(tools["calc_gsm8k_reward"]) is AnswerTool


def test_a_class_that_is_no_tool_is_refused_naming_both_base_classes(tmp_path):
    import verl_compat.tools  # noqa: F401  (what COLORL_PRELOAD imports)
    from workers.tools import ToolConfigError, load_tools

    (tmp_path / "plain.py").write_text("class NotATool:\n    def __init__(self, config, tool_schema):\n        pass\n")
    (tmp_path / "tools.yaml").write_text(f"tools:\n  - class_name: {tmp_path / 'plain.py'}:NotATool\n")
    with pytest.raises(ToolConfigError, match="not a subclass of workers.tools.BaseTool") as raised:
        load_tools(str(tmp_path / "tools.yaml"), None)
    assert str(raised.value).endswith("(or of verl.tools.base_tool.BaseTool)")
