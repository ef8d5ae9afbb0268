"""LoRA through peft: adapters on a causal LM, the reference policy as the same module with them disabled.

With ``actor_rollout_ref.model.lora_rank`` > 0 the actor trains low-rank adapters ΔW = (α/r)·B·A beside frozen
base weights (peft initialises B = 0, so the adapted model starts as the base model). The reference policy is
then the base model itself: the actor's module run inside :func:`as_reference`, so the base weights are held
once. Checkpoints hold only the adapters (``workers.checkpoint.shards``: the trainable parameters'
shards, and peft's ``adapter_config.json``, whose ``base_model_name_or_path`` names the base model);
``trainer.export`` merges them into the base weights.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora.layer import Linear as LoraLinear
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn
from torch.nn import functional as F
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.pytorch_utils import Conv1D

from config import ConfigError

ADAPTER = "default"  # peft's name of the one adapter; its checkpoint keys leave it out
ALL_LINEAR = "all-linear"  # peft's shorthand: every linear layer but the output head
ADAPTABLE = (nn.Linear, nn.Embedding, Conv1D)  # the layer types a target name must reach
TARGETS_KEY = "actor_rollout_ref.model.target_modules"


def is_lora(module: nn.Module) -> bool:
    return isinstance(module, PeftModel)


def add_adapters(model: nn.Module, model_config: Any) -> nn.Module:
    """``model`` with LoRA adapters on ``target_modules`` (only they train) when ``lora_rank`` > 0, else as is;
    ``ConfigError`` when a target matches no layer of it.

    Before sharding: FSDP then shards the peft model, whose transformer blocks it still finds through the
    base model's ``_no_split_modules``.
    """
    if model_config.lora_rank == 0:
        return model
    targets = model_config.target_modules
    check_targets(model, targets)
    config = LoraConfig(
        r=int(model_config.lora_rank),
        lora_alpha=float(model_config.lora_alpha),
        target_modules=targets if isinstance(targets, str) else list(targets),
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, config)
    except ValueError as exc:  # another of peft's refusals
        raise ConfigError.invalid(TARGETS_KEY, targets, str(exc)) from None


def check_target_modules(model_config: Any) -> None:
    """Fail before any worker starts when ``target_modules`` names no layer of the model (``check_targets``). The
    model is built from its config on the meta device: no weight is read, no memory taken."""
    if model_config.lora_rank == 0 or model_config.target_modules == ALL_LINEAR:
        return
    config = AutoConfig.from_pretrained(model_config.path, trust_remote_code=model_config.trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=model_config.trust_remote_code)
    check_targets(model, model_config.target_modules)


def check_targets(model: nn.Module, targets: str | list[str]) -> None:
    """``ConfigError`` naming the model's layers when a LoRA target matches none of them, as peft matches names (a
    list: a layer's full name or its last parts; a string: a regular expression over full names)."""
    if targets == ALL_LINEAR:
        return
    layers = [name for name, module in model.named_modules() if isinstance(module, ADAPTABLE)]
    if isinstance(targets, str):
        unmatched = [] if any(re.fullmatch(targets, name) for name in layers) else [targets]
    else:
        unmatched = [t for t in targets if not any(name == t or name.endswith(f".{t}") for name in layers)]
    if unmatched:
        names = sorted({name.rpartition(".")[2] for name in layers})
        raise ConfigError.invalid(
            TARGETS_KEY,
            targets,
            f"{unmatched} match no layer of the model; its layers are named {names}, or use {ALL_LINEAR!r}",
        )


@contextmanager
def as_reference(module: nn.Module) -> Iterator[None]:
    """Run ``module`` as the reference policy: a LoRA model with its adapters disabled, any other as it is.

    Only the flag each LoRA layer's forward reads is switched. peft's ``disable_adapter()`` also flips the
    adapters' ``requires_grad``, and under FSDP2 that lands on whichever parameter objects are registered at
    that moment (sharded or gathered), so a gathered root left the sharded adapters frozen for the next update.
    """
    layers = [m for m in module.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer in layers:
            layer._disable_adapters = False


@contextmanager
def merged_adapters(module: nn.Module) -> Iterator[None]:
    """Inside, each LoRA linear of ``module`` runs as one linear with W + ΔW (ΔW = (α/r)·B·A, computed on entry):
    a no-grad forward (sampling) pays one matmul per layer instead of three and an add.

    The base weight is not touched: the merged weight is a new tensor in the base weight's dtype, freed on exit
    (peft's ``merge_adapter`` adds in place, and subtracting again would leave the frozen base weights a rounding
    error off each step; the trainer keeps its own weights and fp32 adapter masters). In bf16 the sum W + ΔW is
    taken in fp32 and rounded once: the merged weight is the nearest bf16 to the adapted one, so sampling differs
    from the unmerged bf16 forward by bf16's rounding, within the log-prob bound the docs state for bf16 (a small ΔW
    may round away against W's larger entries: that is the precision the sampler's weights have). Linears whose base
    is not an ``nn.Linear`` (GPT-2's Conv1D) or that use DoRA keep peft's forward.
    """
    layers = [m for m in mergeable(module) if not m.disable_adapters and not m.merged]
    with torch.no_grad():
        for layer in layers:
            base = layer.get_base_layer()
            layer.forward = partial(_linear, weight=merged_weight(layer), bias=base.bias)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward


def merged_weight(layer: nn.Module) -> torch.Tensor:
    """W + ΔW of a LoRA linear (each active adapter's ΔW), summed in fp32 and cast to W's dtype: a new tensor."""
    weight = layer.get_base_layer().weight
    deltas = [layer.get_delta_weight(a) for a in layer.active_adapters if a in layer.lora_A]
    return (weight.float() + sum(d.float() for d in deltas)).to(weight.dtype)


def linear_weight(layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) a linear runs with: inside :func:`merged_adapters` the merged copy; a LoRA linear outside
    it W + ΔW (a new tensor; its base alone with adapters disabled); any other linear its own."""
    forward = layer.__dict__.get("forward")
    if isinstance(forward, partial) and forward.func is _linear:
        return forward.keywords["weight"], forward.keywords["bias"]
    if isinstance(layer, LoraLinear):
        base = layer.get_base_layer()
        if layer.disable_adapters or layer.merged:
            return base.weight, base.bias
        with torch.no_grad():
            return merged_weight(layer), base.bias
    return layer.weight, layer.bias


def merged_weights(module: nn.Module, named: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """``module``'s parameters ``named`` (e.g. one gathered FSDP unit's) under the base model's checkpoint names,
    each LoRA linear's adapters merged into its weight (W + ΔW, a new tensor): what an inference engine without
    adapters loads. A model without adapters passes through. The adapters of a LoRA linear must be in the same
    list as its base weight (they are in the same block, so in the same FSDP unit)."""
    if not is_lora(module):
        return named
    out = []
    with torch.no_grad():
        for name, tensor in named:
            if ".lora_" in name:  # folded into the base weight below
                continue
            owner, _, leaf = name.rpartition(".base_layer.")
            if owner and leaf == "weight":
                layer = module.get_submodule(owner)
                if layer not in mergeable(layer):
                    raise ValueError(f"{owner}: a {type(layer).__name__} adapter cannot be merged for vLLM")
                tensor = tensor + sum(layer.get_delta_weight(a) for a in layer.active_adapters if a in layer.lora_A)
            out.append((_base_name(name), tensor))
    return out


def _base_name(name: str) -> str:
    """peft's parameter name -> the base model's (``base_model.model.`` and ``.base_layer`` removed)."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def mergeable(module: nn.Module) -> list[nn.Module]:
    """The LoRA linears of ``module`` that :func:`merged_adapters` can merge: an ``nn.Linear`` base, no DoRA."""
    return [
        m
        for m in module.modules()
        if isinstance(m, LoraLinear) and type(m.get_base_layer()) is nn.Linear and not any(m.use_dora.values())
    ]


def _linear(
    x: torch.Tensor, *args: Any, weight: torch.Tensor, bias: torch.Tensor | None, **kwargs: Any
) -> torch.Tensor:
    return F.linear(x, weight, bias)


def rank(module: nn.Module) -> int:
    """The module's ``lora_rank``: 0 for a model that trains all its weights."""
    return module.peft_config[ADAPTER].r if is_lora(module) else 0


def check_checkpoint_kind(src: Path, module: nn.Module) -> None:
    """A clear error when a role directory holds adapters and the model trains all weights, or the other way."""
    holds_adapters = (src / "adapter_config.json").exists()
    if holds_adapters != is_lora(module):
        saved = "LoRA adapters" if holds_adapters else "full weights"
        raise ValueError(
            f"checkpoint {src} holds {saved}, but actor_rollout_ref.model.lora_rank={rank(module)}: "
            "resume with the lora_rank the run was saved with"
        )
