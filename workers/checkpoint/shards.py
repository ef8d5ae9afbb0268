"""Saving and loading one trained role (actor or critic), sharded, in a world-size-independent layout.

A role directory holds:

- ``.metadata`` and ``__<r>_0.distcp``: the model and AdamW state as ``torch.distributed.checkpoint`` (DCP) writes
  it: each rank writes only its own shards, all ranks at once, keyed by parameter name, so that it loads into any
  number of ranks (DCP reshards on load) and no rank ever holds the whole model;
- ``config.json`` (+ ``generation_config.json``) and the tokenizer files: what ``trainer.export`` needs to turn
  the shards into a Hugging Face model directory; for a LoRA model (``workers.parallel.lora``) the shards hold only the
  adapters (the trainable parameters: the frozen base is the pretrained model) and ``adapter_config.json`` names
  the base model;
- ``extra.pt``: the LR-scheduler state and the world size;
- ``rng_rank<r>.pt``: each rank's random-number-generator state (restored when the world size matches).

Every rank calls these functions (they are collectives). Everything is read back as tensors and plain types
only: a checkpoint may come from a shared file system, and unpickling anything else can run code.
"""

from __future__ import annotations

import io
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint import metadata as metadata_module
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from workers.checkpoint.safe_files import (
    WRITE_ERRORS,
    CheckpointWriteError,
    UnsafeCheckpointError,
    fsync,
    load_plain,
    write_error,
)
from workers.parallel import fsdp, lora


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rng_state() -> dict[str, Any]:
    """Every generator's state as tensors and plain types, so that :func:`load_plain` can read it back."""
    numpy_state = np.random.get_state(legacy=False)
    version, mt_state, gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            **numpy_state,
            "state": {
                "key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
                "pos": int(numpy_state["state"]["pos"]),
            },
        },
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


def _state(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's part of the model and optimizer state, keyed by parameter name: DTensor shards under FSDP
    (views of the parameters themselves, so a DCP load writes straight into them)."""
    model = get_model_state_dict(module)
    if lora.is_lora(module):  # the adapters only: the frozen base is the pretrained model, unchanged by training
        trainable = {name for name, param in module.named_parameters() if param.requires_grad}
        model = {name: tensor for name, tensor in model.items() if name in trainable}
    return {"model": model, "optimizer": get_optimizer_state_dict(module, optimizer)}


def save_role(path: str, module: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, tokenizer: Any) -> None:
    """Write this rank's shards of ``module`` and ``optimizer`` (DCP), plus config, tokenizer, scheduler and RNG,
    under ``path``; every file is flushed to disk. A failed write (a full disk) raises
    :class:`CheckpointWriteError` on every rank."""
    out = Path(path)

    def write_shared() -> None:
        out.mkdir(parents=True, exist_ok=True)
        module.config.save_pretrained(out)
        if getattr(module, "generation_config", None) is not None:
            module.generation_config.save_pretrained(out)
        tokenizer.save_pretrained(out)
        if lora.is_lora(module):
            module.peft_config[lora.ADAPTER].save_pretrained(out)  # adapter_config.json, with the base model's path
        torch.save({"lr_scheduler": scheduler.state_dict(), "world_size": _world_size()}, out / "extra.pt")
        for file in out.iterdir():
            fsync(file)

    _agree(_attempt(out, write_shared) if _rank() == 0 else None)
    rng_file = out / f"rng_rank{_rank()}.pt"

    def write_own() -> None:
        dcp.save(
            _state(module, optimizer),
            storage_writer=FileSystemWriter(out, sync_files=True),
            no_dist=not dist.is_initialized(),
        )
        torch.save(rng_state(), rng_file)
        fsync(rng_file)
        fsync(out)

    _agree(_attempt(out, write_own))


def load_role(path: str, module: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    """Restore what :func:`save_role` wrote, by any number of ranks, into a model sharded over any number."""
    src = Path(path)
    missing = [name for name in ("config.json", ".metadata", "extra.pt") if not (src / name).exists()]
    if missing:
        unsharded = (
            " (an unsharded checkpoint of an older ColoRL: not resumable)" if (src / "optimizer.pt").exists() else ""
        )
        raise FileNotFoundError(f"checkpoint {src} is incomplete: missing {missing}{unsharded}")
    lora.check_checkpoint_kind(src, module)
    reader = PlainReader(src)
    for group in fsdp.fsdp_modules(module):  # a gathered copy left by an earlier forward would go stale
        group.reshard()
    state = _state(module, optimizer)
    configured = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    check_fits(src, reader.read_metadata(), state["model"], "model.")
    try:
        dcp.load(state, storage_reader=reader, planner=PlainLoadPlanner(), no_dist=not dist.is_initialized())
    except CheckpointException as exc:  # every rank's errors, wrapped: raise the first as what it is
        first = next(iter(exc.failures.values()))[0]
        if isinstance(first, UnsafeCheckpointError):
            raise first from None
        raise ValueError(f"cannot read checkpoint {src}: {type(first).__name__}: {first}") from None
    # a LoRA checkpoint fills the adapters only (the frozen base stays as loaded); check_fits checked the rest
    set_model_state_dict(module, state["model"], options=StateDictOptions(strict=not lora.is_lora(module)))
    set_optimizer_state_dict(module, optimizer, state["optimizer"])
    extra = load_plain(src / "extra.pt")
    scheduler.load_state_dict({**extra["lr_scheduler"], "base_lrs": scheduler.base_lrs})
    _keep_configured(optimizer, scheduler, configured)
    rng_file = src / f"rng_rank{_rank()}.pt"
    if extra["world_size"] == _world_size() and rng_file.exists():  # elastic resume starts fresh streams
        set_rng_state(load_plain(rng_file))


def _keep_configured(optimizer: torch.optim.Optimizer, scheduler: Any, configured: list[dict[str, Any]]) -> None:
    """The hyper-parameters this run's config built the optimizer and schedule with, not the checkpoint's: a
    changed learning rate, betas or weight decay applies from the next update (the driver prints it:
    ``trainer.state.fingerprint``); the moments (exp_avg, exp_avg_sq, step) and the schedule's position are the
    checkpoint's, and the learning rate is the schedule's at that position."""
    for group, values in zip(optimizer.param_groups, configured):
        group.update(values)
    for group, base, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * factor(scheduler.last_epoch)


def check_fits(src: Path, metadata: Metadata, expected: dict[str, torch.Tensor], prefix: str) -> None:
    """A clear error when the checkpoint at ``src`` holds other tensors than ``expected`` (``prefix`` + name)."""
    saved = {
        k[len(prefix) :]: tuple(v.size)
        for k, v in metadata.state_dict_metadata.items()
        if k.startswith(prefix) and hasattr(v, "size")
    }
    # a DTensor's .shape is the global (unsharded) shape
    wrong = {k: (saved[k], tuple(v.shape)) for k, v in expected.items() if k in saved and saved[k] != tuple(v.shape)}
    missing = sorted(set(expected) - set(saved))
    if wrong or missing:
        raise ValueError(
            f"checkpoint {src} does not fit this model (a different model config?): "
            f"missing {missing[:5]}, shape mismatches (saved, expected) {dict(list(wrong.items())[:5])}"
        )


# What DCP's .metadata pickle may name besides its own metadata classes: nothing that can run code.
_METADATA_GLOBALS = {
    ("pathlib", "PosixPath"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BufferedReader, source: Path) -> None:
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        own = (
            module == metadata_module.__name__ and getattr(vars(metadata_module).get(name), "__module__", "") == module
        )
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if not (own or dtype or (module, name) in _METADATA_GLOBALS):
            raise UnsafeCheckpointError(
                f"refusing to load {self.source}: it names {module}.{name}, which is not "
                "part of a checkpoint's metadata (a crafted file?)"
            )
        return super().find_class(module, name)


class PlainReader(FileSystemReader):
    """DCP's file reader, unpickling ``.metadata`` with only the classes a checkpoint's metadata consists of."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / ".metadata"
        with open(path, "rb") as f:
            try:
                metadata = _MetadataUnpickler(f, path).load()
            except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as exc:
                raise UnsafeCheckpointError(f"refusing to load {path}: not a checkpoint's metadata ({exc})") from None
        if not isinstance(metadata, Metadata):
            raise UnsafeCheckpointError(f"refusing to load {path}: it holds a {type(metadata).__name__}, not Metadata")
        metadata.storage_meta = metadata.storage_meta or StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class PlainLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, reading non-tensor values (optimizer hyper-parameters) with ``weights_only``."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        obj = load_plain(value, f"{read_item.dest_index.fqn} of a checkpoint shard")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj
