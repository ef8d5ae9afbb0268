"""Everything FSDP2 in ColoRL: sharding, gathering for generation, grad clipping, offload.

This is the only module that imports ``fully_shard``; the actor, critic and rollout code take a plain
``nn.Module`` and work the same whether it is sharded or not (a world of one process needs no FSDP).
"""

from __future__ import annotations

import functools
import platform
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

# Where apply_fsdp records each sharded module's own reshard_after_forward, so gathered_params can restore it.
_RESHARD_ATTR = "_colorl_reshard_after_forward"


DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32}


def mixed_precision(
    device: torch.device, param_dtype: str = "auto", reduce_dtype: str = "fp32"
) -> tuple[torch.dtype | None, torch.dtype | None]:
    """(param_dtype, reduce_dtype) for ``apply_fsdp`` from a ``fsdp_config.mixed_precision`` section.

    ``auto`` computes in bf16 on CUDA and in fp32 elsewhere, so a CPU run's numbers do not depend on which CPU it
    lands on. ``native`` computes in bf16 wherever the device multiplies bf16 natively: CUDA, and a CPU with bf16
    matmul instructions (AVX512-BF16, AMX; ``cpu_has_bf16``), where bf16 steps are 1.4-2.3x faster; fp32 elsewhere
    (docs/benchmarks.md, "Precision"). (None, None) is plain fp32: nothing to cast (an fp32 model may still reduce
    its gradients in bf16 across ranks).
    """
    if param_dtype == "auto":
        param_dtype = "bf16" if device.type == "cuda" else "fp32"
    elif param_dtype == "native":
        param_dtype = "bf16" if device.type == "cuda" or (device.type == "cpu" and cpu_has_bf16()) else "fp32"
    param = None if DTYPES[param_dtype] == torch.float32 else DTYPES[param_dtype]
    if param is not None and device.type == "cpu" and not cpu_has_bf16():
        warnings.warn(
            f"fsdp_config.mixed_precision.param_dtype={param_dtype} on a CPU without bf16 matmul "
            "instructions (AVX512-BF16, AMX): its bf16 matmuls are emulated, orders of magnitude slower "
            "than fp32; fp32 (or auto, or native) is faster here",
            stacklevel=2,
        )
    reduce = None if param is None and DTYPES[reduce_dtype] == torch.float32 else DTYPES[reduce_dtype]
    return param, reduce


@functools.cache
def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices natively: on x86, AVX512-BF16 or AMX (torch's cpuinfo). oneDNN's
    ``_is_mkldnn_bf16_supported`` is not that test: it holds on any AVX-512 CPU, which emulates bf16 without them
    (slower than fp32: docs/benchmarks.md, "bf16 on a CPU"). Elsewhere (ARM), oneDNN's answer."""
    if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
        return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch build without oneDNN: unknown, so no warning
        return True


def role_precision(device: torch.device, config: Any) -> tuple[torch.dtype | None, torch.dtype | None]:
    """``mixed_precision`` of a role's ``fsdp_config.mixed_precision`` section."""
    return mixed_precision(device, config.param_dtype, config.reduce_dtype)


def compute_dtype(device: torch.device, config: Any) -> torch.dtype:
    """The dtype a role computes in, from its ``fsdp_config.mixed_precision`` section."""
    return role_precision(device, config)[0] or torch.float32


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of ``model`` in order: its modules whose class the HF ``model._no_split_modules``
    names (e.g. ``LlamaDecoderLayer``). One pass over the modules: a LoRA model has thousands."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def apply_fsdp(
    model: nn.Module,
    mesh: DeviceMesh | None = None,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = None,
    reshard_after_forward: bool = True,
    min_num_params: int = 0,
) -> nn.Module:
    """Shard ``model`` in place with FSDP2: each transformer block (or unit of blocks), then the root
    (torchtitan's ``apply_fsdp``).

    ``mesh`` defaults to a 1-D mesh over the whole default process group on the model's device type.
    The root keeps its parameters gathered after forward: backward needs them at once, so freeing them
    would only cost a second all-gather. ``min_num_params`` > 0 groups consecutive blocks into units of at
    least that many parameters (``block_units``): every unit costs a collective's latency per gather and
    reduce, which over gloo outweighs the memory small blocks save; the price is that a unit's parameters and
    gradients are unsharded together (docs/benchmarks.md, "FSDP units").

    On one rank (``workers.roles.role.shard_role`` sends only an offloaded bf16 role here) the whole model is one
    group: FSDP then only casts and moves it, and per-block groups would add hooks and graph breaks under
    ``torch.compile``.
    """
    world_size = mesh.size() if mesh is not None else dist.get_world_size()
    if mesh is None:
        device_type = next(model.parameters()).device.type
        mesh = init_device_mesh(device_type, (world_size,))
    mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    blocks = transformer_blocks(model) if world_size > 1 else []
    if world_size > 1 and not blocks:
        raise ValueError(
            f"found no transformer blocks to shard in {type(model).__name__}: "
            f"_no_split_modules={getattr(model, '_no_split_modules', None)}"
        )
    for unit in block_units(blocks, min_num_params):
        # a list of modules is one FSDP group; a single block is passed as itself, FSDP's usual form
        fully_shard(
            unit if len(unit) > 1 else unit[0],
            mesh=mesh,
            mp_policy=mp_policy,
            reshard_after_forward=reshard_after_forward,
        )
        for block in unit:
            setattr(block, _RESHARD_ATTR, reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=False)
    setattr(model, _RESHARD_ATTR, False)
    return model


def block_units(blocks: list[nn.Module], min_num_params: int = 0) -> list[list[nn.Module]]:
    """Consecutive ``blocks`` grouped into FSDP units of at least ``min_num_params`` parameters each (0: one
    block per unit). Blocks after the last full unit stay in the root's group, so a model whose blocks together
    hold fewer than ``min_num_params`` is one group. The key is ``fsdp_config.wrap_policy.min_num_params``
    (grouping consecutive blocks, rather than wrapping any submodule of that size)."""
    units: list[list[nn.Module]] = []
    unit: list[nn.Module] = []
    size = 0
    for block in blocks:
        unit.append(block)
        size += sum(p.numel() for p in block.parameters())
        if size >= min_num_params:
            units.append(unit)
            unit, size = [], 0
    return units


def fsdp_modules(model: nn.Module) -> list[FSDPModule]:
    """Every FSDP-sharded submodule of ``model`` (empty for a plain module)."""
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_fsdp(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule)


@contextmanager
def gathered_params(model: nn.Module) -> Iterator[nn.Module]:
    """Unshard every FSDP group once on entry and reshard on exit; forwards inside run without collectives.

    Token-by-token decoding calls forward once per token; without this each call would all-gather every
    block, and ranks that stop decoding at different steps would then wait on each other forever.
    Entry all-gathers each group once (so all ranks must enter together; a unit of several blocks is listed
    once per block, and its second ``unshard`` is a no-op); exit only frees memory.
    A plain (unsharded) module passes through unchanged.
    """
    modules = fsdp_modules(model)
    for m in modules:
        m.set_reshard_after_forward(False, recurse=False)
    for m in modules:
        m.unshard()
    try:
        yield model
    finally:
        for m in modules:
            m.set_reshard_after_forward(getattr(m, _RESHARD_ATTR, True), recurse=False)
            m.reshard()


def gathered_units(model: nn.Module) -> Iterator[list[tuple[str, Tensor]]]:
    """The full parameters of ``model``, one FSDP unit at a time: each list holds (name, full tensor) of the
    parameters one unit's gather made whole (named as in ``model``; copies under FSDP, since the unit is resharded
    before the next is gathered). So a consumer (the vLLM engine's weight load) holds one unit's full tensors at a
    time beside the shards, plus any it keeps. All ranks must iterate together (each gather is a collective).
    A plain module is one unit with its parameters as they are."""
    done: set[str] = set()
    for unit in fsdp_modules(model) or [model]:
        if all(n in done for n, _ in _own_parameters(model, unit)):
            continue  # a block of a multi-block unit that was gathered with an earlier block
        if isinstance(unit, FSDPModule):
            unit.unshard()
        try:
            full = [
                (n, p.detach()) for n, p in model.named_parameters() if n not in done and not isinstance(p, DTensor)
            ]
            # copies under FSDP: the reshard frees the gathered storage, and a consumer may keep a tensor longer
            # (vLLM defers a vocabulary layer padded beyond the checkpoint's rows to the end of the load)
            named = [(n, p.clone()) for n, p in full] if isinstance(unit, FSDPModule) else full
            done.update(n for n, _ in named)
            yield named
        finally:
            if isinstance(unit, FSDPModule):
                unit.reshard()


def load_full_units(model: nn.Module, units: Iterable[dict[str, Tensor]]) -> None:
    """Copy full tensors (by ``model``'s parameter names, as ``gathered_units`` gives them) into ``model``: each rank
    keeps its own shard of each (split locally: no collective), a plain module the tensors as they are."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for unit in units:
            for name, full in unit.items():
                param = params[name]
                if isinstance(param, DTensor):
                    full = full.to(param.device, param.dtype)
                    shard = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
                    param.to_local().copy_(shard.to_local())
                else:
                    param.copy_(full)


def _own_parameters(model: nn.Module, unit: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """``unit``'s parameters, named as in ``model`` (the root's include its blocks')."""
    prefix = next(name for name, module in model.named_modules() if module is unit)
    yield from unit.named_parameters(prefix=prefix)


def clip_grad_norm_(optimizer: torch.optim.Optimizer, max_norm: float) -> Tensor:
    """Clip the gradients of the parameters ``optimizer`` steps to a global L2 norm of ``max_norm``; returns the
    pre-clip norm as a plain scalar tensor.

    The optimizer's parameters, not the module's: with ``MasterWeights`` the gradients live on the fp32
    masters. With FSDP they are sharded DTensors and the norm is all-reduced, so every rank sees the same
    value (and makes the same skip-or-step decision for a non-finite norm).
    """
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return norm


def _reshard_all(model: nn.Module) -> None:
    # The root keeps gathered parameters after a no-grad forward; free them before moving shards around.
    for m in fsdp_modules(model):
        m.reshard()


def offload_fsdp_params(model: nn.Module) -> None:
    """Move the (sharded) parameters and gradients to CPU between phases; no-op when already on CPU."""
    if next(model.parameters()).device.type == "cpu":
        return
    _reshard_all(model)
    model.to("cpu")
    torch.cuda.empty_cache()


def load_fsdp_params(model: nn.Module, device: torch.device) -> None:
    """Bring parameters back to ``device`` after ``offload_fsdp_params``; no-op on CPU."""
    if device.type == "cpu":
        return
    model.to(device)


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> Iterator[tuple[dict, str, Tensor]]:
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, Tensor) and value.dim() > 0:
                yield state, key, value


def offload_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Move optimizer state (Adam moments) to CPU; no-op when it already lives there."""
    moved = False
    for state, key, value in _optimizer_tensors(optimizer):
        if value.device.type != "cpu":
            state[key] = value.to("cpu", non_blocking=True)
            moved = True
    if moved:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def load_optimizer(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Move optimizer state back to ``device``; no-op on CPU."""
    if device.type == "cpu":
        return
    for state, key, value in _optimizer_tensors(optimizer):
        state[key] = value.to(device, non_blocking=True)


@contextmanager
def onloaded(
    module: nn.Module,
    device: torch.device,
    optimizer: torch.optim.Optimizer | None = None,
    offload_params: bool = False,
    offload_optimizer_state: bool = False,
) -> Iterator[None]:
    """Bring offloaded parameters (and optimizer state) to ``device`` for one phase, offload them after.

    On exit every FSDP group is resharded first: the root's group stays gathered after a forward that builds no
    gradients (log-prob, values, reward-model scores), and with small blocks in it (``block_units``) that is
    the whole model. With both flags off (the default, and always the case on CPU) nothing is moved.
    """
    if offload_params:
        load_fsdp_params(module, device)
    if offload_optimizer_state and optimizer is not None:
        load_optimizer(optimizer, device)
    try:
        yield
    finally:
        _reshard_all(module)
        if offload_params:
            offload_fsdp_params(module)
        if offload_optimizer_state and optimizer is not None:
            offload_optimizer(optimizer)
