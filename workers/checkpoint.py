"""Saving and loading one trained role (actor or critic) in a world-size-independent layout.

A role directory holds:

- a Hugging Face model directory (``config.json``, ``model.safetensors``, tokenizer files): the weights,
  unsharded, loadable with ``from_pretrained`` — so every actor checkpoint is also an HF export; for a LoRA
  model, peft's adapter directory instead (``adapter_config.json``, ``adapter_model.safetensors``: ``workers.lora``);
- ``optimizer.pt``: the AdamW state, unsharded and keyed by parameter name;
- ``extra.pt``: the LR-scheduler state;
- ``rng_rank<r>.pt``: each rank's random-number-generator state (restored when the world size matches).

Gathering and scattering are collectives: every rank calls these functions; rank 0 does the file I/O.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from workers import fsdp, lora


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save_role(path: str, module: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, tokenizer: Any) -> None:
    """Write ``module`` (HF format), optimizer, scheduler and this rank's RNG under ``path``."""
    # a LoRA model's save_pretrained writes only the adapters (and the base model's path)
    model_state = fsdp.trainable_state_dict(module) if lora.is_lora(module) else fsdp.full_state_dict(module)
    optim_state = fsdp.full_optimizer_state_dict(module, optimizer)
    out = Path(path)
    error = None
    if _rank() == 0:
        try:
            out.mkdir(parents=True, exist_ok=True)
            # save_pretrained with an explicit state dict drops tied duplicates (lm_head = embed_tokens)
            module.save_pretrained(out, state_dict=model_state, safe_serialization=True)
            tokenizer.save_pretrained(out)
            torch.save(optim_state, out / "optimizer.pt")
            torch.save({"lr_scheduler": scheduler.state_dict(), "world_size": _world_size()}, out / "extra.pt")
        except OSError as exc:  # e.g. a full disk: every rank must learn it, or they would wait for rank 0
            error = f"{type(exc).__name__}: {exc}"
    if dist.is_initialized():
        shared = [error]
        dist.broadcast_object_list(shared, src=0)  # also orders rank 0's mkdir before the others' writes
        error = shared[0]
    if error is not None:
        raise OSError(f"rank 0 could not write the checkpoint to {out}: {error}")
    torch.save(rng_state(), out / f"rng_rank{_rank()}.pt")


def load_role(path: str, module: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    """Restore what :func:`save_role` wrote, into a model sharded over any number of ranks."""
    src = Path(path)
    lora.check_checkpoint_kind(src, module)
    weights = "adapter_config.json" if lora.is_lora(module) else "config.json"
    missing = [name for name in (weights, "optimizer.pt", "extra.pt") if not (src / name).exists()]
    if missing:
        raise FileNotFoundError(f"checkpoint {src} is incomplete: missing {missing}")
    if lora.is_lora(module):
        lora.load_adapters(src, module)
    else:
        model_state = _load_weights(src, module) if _rank() == 0 else {}
        fsdp.load_full_state_dict(module, model_state, broadcast_from_rank0=dist.is_initialized())
    optim_state = torch.load(src / "optimizer.pt", weights_only=False) if _rank() == 0 else {}
    fsdp.load_full_optimizer_state_dict(module, optimizer, optim_state)
    extra = torch.load(src / "extra.pt", weights_only=False)
    scheduler.load_state_dict(extra["lr_scheduler"])
    rng_file = src / f"rng_rank{_rank()}.pt"
    if extra["world_size"] == _world_size() and rng_file.exists():  # elastic resume starts fresh streams
        set_rng_state(torch.load(rng_file, weights_only=False))


def _load_weights(src: Path, module: nn.Module) -> dict[str, torch.Tensor]:
    """The saved tensors, with tied weights filled back in and a clear error for a different model."""
    from safetensors.torch import load_file

    files = sorted(src.glob("*.safetensors"))
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(file))
    expected = module.state_dict()
    for key in expected:
        if key not in state and getattr(module.config, "tie_word_embeddings", False) and key.endswith("lm_head.weight"):
            state[key] = state[key.replace("lm_head.weight", "model.embed_tokens.weight")]
    # a DTensor's .shape is the global (unsharded) shape
    wrong = {k: (tuple(state[k].shape), tuple(v.shape)) for k, v in expected.items() if k in state and state[k].shape != v.shape}
    missing = sorted(set(expected) - set(state))
    if wrong or missing:
        raise ValueError(
            f"checkpoint {src} does not fit this model (a different model config?): "
            f"missing {missing[:5]}, shape mismatches (saved, expected) {dict(list(wrong.items())[:5])}"
        )
    return state
