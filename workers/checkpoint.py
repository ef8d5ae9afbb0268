"""Saving and loading one trained role (actor or critic) in a world-size-independent layout.

A role directory holds:

- a Hugging Face model directory (``config.json``, ``model.safetensors``, tokenizer files): the weights,
  unsharded, loadable with ``from_pretrained`` — so every actor checkpoint is also an HF export;
- ``optimizer.pt``: the AdamW state, unsharded and keyed by parameter name;
- ``extra.pt``: the LR-scheduler state;
- ``rng_rank<r>.pt``: each rank's random-number-generator state (restored when the world size matches).

Gathering and scattering are collectives: every rank calls these functions; rank 0 does the file I/O.
"""

from __future__ import annotations

import os
import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors import SafetensorError
from torch import nn

from workers import fsdp


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def fsync(path: str | Path) -> None:
    """Flush ``path`` (a file, or a directory's entries) to stable storage: a rename or a ``COMPLETE`` marker
    that reaches the disk before the data it vouches for would survive a power cut that the data does not."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# What the writers raise when a write fails part-way (e.g. a full disk): OSError from plain files, SafetensorError
# from safetensors, RuntimeError from torch.save's zip writer.
WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)


class CheckpointWriteError(OSError):
    """A checkpoint file that could not be written (e.g. a full disk); the message names the path and free space."""


def write_error(path: str | Path, exc: BaseException, who: str = "") -> CheckpointWriteError:
    """A :class:`CheckpointWriteError` for writing under ``path`` failing with ``exc``, with the space left there."""
    existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    first_line = (str(exc).splitlines() or [""])[0]
    return CheckpointWriteError(f"{who}could not write the checkpoint to {path}: {type(exc).__name__}: {first_line} "
                                f"({free / 2**20:.1f} MiB free on that file system)")


class UnsafeCheckpointError(ValueError):
    """A checkpoint file holding pickled objects beyond tensors and plain types (loading it could run code)."""


def load_plain(file: str | Path) -> Any:
    """``torch.load`` restricted to tensors and plain Python types (``weights_only``): a checkpoint may come from a
    shared file system or ``trainer.resume_from_path``, and unpickling anything else can run arbitrary code."""
    try:
        return torch.load(file, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        first_line = (str(exc).splitlines() or [""])[0]
        raise UnsafeCheckpointError(
            f"refusing to load {file}: it holds pickled Python objects other than tensors and plain types, which "
            f"could run code when loaded (a crafted file, or one written by an older ColoRL): {first_line}"
        ) from None


def rng_state() -> dict[str, Any]:
    """Every generator's state as tensors and plain types, so that :func:`load_plain` can read it back."""
    numpy_state = np.random.get_state(legacy=False)
    version, mt_state, gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {**numpy_state, "state": {"key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
                                           "pos": int(numpy_state["state"]["pos"])}},
        "python": [version, list(mt_state), gauss],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    numpy_state = state["numpy"]
    key = numpy_state["state"]["key"].numpy().astype(np.uint32)
    np.random.set_state({**numpy_state, "state": {**numpy_state["state"], "key": key}})
    version, mt_state, gauss = state["python"]
    random.setstate((version, tuple(mt_state), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _agree(error: CheckpointWriteError | None) -> None:
    """Raise on every rank if any rank failed to write: a rank that raised alone would leave the others
    waiting for it in their next collective (also a barrier: rank 0's files exist once it returns)."""
    errors = [str(error) if error else None]
    if dist.is_initialized():
        errors = [None] * _world_size()
        dist.all_gather_object(errors, str(error) if error else None)
    failed = [(rank, message) for rank, message in enumerate(errors) if message]
    if failed:
        rank, message = failed[0]
        raise CheckpointWriteError(f"rank {rank} {message}")


def _attempt(out: Path, write: Any) -> CheckpointWriteError | None:
    try:
        write()
    except WRITE_ERRORS as exc:
        return write_error(out, exc)
    return None


def save_role(path: str, module: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, tokenizer: Any) -> None:
    """Write ``module`` (HF format), optimizer, scheduler and this rank's RNG under ``path``; every file is
    flushed to disk. A failed write (a full disk) raises :class:`CheckpointWriteError` on every rank."""
    model_state = fsdp.full_state_dict(module)
    optim_state = fsdp.full_optimizer_state_dict(module, optimizer)
    out = Path(path)

    def write_shared() -> None:
        out.mkdir(parents=True, exist_ok=True)
        # save_pretrained with an explicit state dict drops tied duplicates (lm_head = embed_tokens)
        module.save_pretrained(out, state_dict=model_state, safe_serialization=True)
        tokenizer.save_pretrained(out)
        torch.save(optim_state, out / "optimizer.pt")
        torch.save({"lr_scheduler": scheduler.state_dict(), "world_size": _world_size()}, out / "extra.pt")
        for file in out.iterdir():
            fsync(file)

    _agree(_attempt(out, write_shared) if _rank() == 0 else None)
    rng_file = out / f"rng_rank{_rank()}.pt"

    def write_own() -> None:
        torch.save(rng_state(), rng_file)
        fsync(rng_file)
        fsync(out)

    _agree(_attempt(out, write_own))


def load_role(path: str, module: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    """Restore what :func:`save_role` wrote, into a model sharded over any number of ranks."""
    src = Path(path)
    missing = [name for name in ("config.json", "optimizer.pt", "extra.pt") if not (src / name).exists()]
    if missing:
        raise FileNotFoundError(f"checkpoint {src} is incomplete: missing {missing}")
    model_state = _load_weights(src, module) if _rank() == 0 else {}
    fsdp.load_full_state_dict(module, model_state, broadcast_from_rank0=dist.is_initialized())
    optim_state = load_plain(src / "optimizer.pt") if _rank() == 0 else {}
    fsdp.load_full_optimizer_state_dict(module, optimizer, optim_state)
    extra = load_plain(src / "extra.pt")
    scheduler.load_state_dict(extra["lr_scheduler"])
    rng_file = src / f"rng_rank{_rank()}.pt"
    if extra["world_size"] == _world_size() and rng_file.exists():  # elastic resume starts fresh streams
        set_rng_state(load_plain(rng_file))


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
