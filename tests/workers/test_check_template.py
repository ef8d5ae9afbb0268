"""python -m workers.tools.check_template: which chat templates build turn by turn, and where the others do not."""

import os
import subprocess
import sys

import pytest

from tests.data.gsm8k_fixture import printable_tokenizer
from tests.workers.agent_helpers import TEMPLATE, chat_tokenizer, chatml_tokenizer, llama3_tokenizer
from workers.tools.check_template import check_template, main

# earlier assistant turns lose their reasoning (as Qwen3's template drops it before the last user message)
DROPS_REASONING = TEMPLATE.replace(
    "{{ m['content'] }}",
    "{{ m['content'].split('</think>\\n')[-1] if m['role'] == 'assistant' and not loop.last else m['content'] }}",
)
NO_TOOL_ROLE = TEMPLATE.replace(
    "{% for m in messages %}",
    "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('roles must alternate') }}{% endif %}",
)


def failures(findings) -> dict[str, str]:
    return {f.check: f.detail for f in findings if not f.ok}


@pytest.mark.parametrize("make", [chat_tokenizer, chatml_tokenizer, llama3_tokenizer])
def test_the_test_template_chatml_and_llama3_build_turn_by_turn(make):
    tokenizer = make()
    stops = [tokenizer.convert_tokens_to_ids(t) for t in tokenizer.all_special_tokens if t in ("<|eom_id|>",)]
    stops.append(tokenizer.eos_token_id)
    findings = check_template(tokenizer, stops, [{"type": "function", "function": {"name": "calculator"}}])
    assert len(findings) == 5 and not failures(findings), failures(findings)


def test_smollm2s_template_builds_turn_by_turn(smollm2_tokenizer):
    findings = check_template(smollm2_tokenizer, [smollm2_tokenizer.eos_token_id])
    assert not failures(findings) and "'\\n' is added" in findings[0].detail


def test_where_a_template_cannot_be_built_turn_by_turn():
    rewriting = printable_tokenizer(DROPS_REASONING)
    found = failures(check_template(rewriting, [rewriting.eos_token_id]))
    assert list(found) == ["conversation: two rounds, a system message"]
    assert found["conversation: two rounds, a system message"].startswith("turn 4 (assistant) differs at token")
    assert "<think>" in found["conversation: two rounds, a system message"]

    no_tool = printable_tokenizer(NO_TOOL_ROLE)
    findings = check_template(no_tool, [no_tool.eos_token_id])
    assert len(findings) == 2 and "roles must alternate" in failures(findings)["tool turn"]

    stops_elsewhere = check_template(chat_tokenizer(), [chat_tokenizer().pad_token_id])
    assert "is not a stop token" in failures(stops_elsewhere)["turn end"]


def test_the_command_exits_1_and_names_the_failing_check(tmp_path, capsys):
    chatml_tokenizer().save_pretrained(tmp_path / "good")
    printable_tokenizer(DROPS_REASONING).save_pretrained(tmp_path / "bad")
    assert main([str(tmp_path / "good"), "--tool-config", "conf/tools/calculator.yaml"]) == 0
    assert capsys.readouterr().out.endswith("can be built turn by turn\n")
    assert main([str(tmp_path / "bad")]) == 1
    out = capsys.readouterr().out
    assert "FAIL conversation: two rounds, a system message: turn 4 (assistant)" in out
    assert out.endswith("cannot be built turn by turn\n")


def test_the_command_reads_a_tool_yaml_that_uses_verls_class_names(tmp_path):
    """conf/tools/gsm8k.yaml names verl's former ``Gsm8kTool``: the command has the door serve it, as main.py does
    (a fresh interpreter without COLORL_PRELOAD, so nothing else imported the door first)."""
    chatml_tokenizer().save_pretrained(tmp_path / "good")
    env = {key: value for key, value in os.environ.items() if key != "COLORL_PRELOAD"}
    command = [sys.executable, "-m", "workers.tools.check_template", str(tmp_path / "good")]
    done = subprocess.run(
        [*command, "--tool-config", "conf/tools/gsm8k.yaml"], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.endswith("can be built turn by turn\n")
