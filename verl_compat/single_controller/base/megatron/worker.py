"""The seeds' ``verl.single_controller.base.megatron.worker``: their Megatron API (the trainer never uses it).

``TensorParallelWorker``: a worker that lives in a (pp, dp, tp) mesh of its group's ranks.

This plays the part of Megatron-LM's ``parallel_state`` (``mpu``) on top of PyTorch's own
``DeviceMesh``, so it runs on gloo (CPU) as well as nccl (GPU). Ranks are laid out as Megatron
lays them out by default, tp fastest, then dp, then pp::

    rank = (pp_rank * dp_size + dp_rank) * tp_size + tp_rank

so the ranks of one tensor-parallel group are neighbours (on one node, where NVLink is).
"""

from __future__ import annotations

from typing import NamedTuple

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from verl_compat.single_controller.base.worker import Worker

__all__ = [
    "DistGlobalInfo",
    "DistRankInfo",
    "MegatronWorker",
    "TensorParallelWorker",
    "model_parallel_mesh",
    "model_parallel_shape",
]

MESH_DIM_NAMES = ("pp", "dp", "tp")
_MESH: DeviceMesh | None = None  # this process's (pp, dp, tp) mesh, as Megatron-LM's parallel_state keeps its groups


class DistRankInfo(NamedTuple):
    """Where one rank sits in the mesh."""

    tp_rank: int
    dp_rank: int
    pp_rank: int


class DistGlobalInfo(NamedTuple):
    """The mesh's size along each dimension."""

    tp_size: int
    dp_size: int
    pp_size: int


def model_parallel_shape(
    world_size: int, tensor_model_parallel_size: int, pipeline_model_parallel_size: int
) -> tuple[int, int, int]:
    """``(pp, dp, tp)`` sizes of the mesh; dp takes the ranks that tp and pp leave: dp = world / (tp * pp)."""
    tp, pp = tensor_model_parallel_size, pipeline_model_parallel_size
    if tp < 1 or pp < 1 or world_size % (tp * pp) != 0:
        raise ValueError(
            f"tensor_model_parallel_size={tp} x pipeline_model_parallel_size={pp} must be positive "
            f"and divide the world size {world_size}"
        )
    return pp, world_size // (tp * pp), tp


class TensorParallelWorker(Worker):
    """A worker whose subclass calls ``self.init_model_parallel(...)`` in ``__init__``.

    Afterwards ``self.device_mesh`` is the (pp, dp, tp) mesh, so a model can be sharded with
    ``parallelize_module(layer, self.device_mesh["tp"], plan)``, and the worker group learns each
    rank's place from ``get_megatron_rank_info`` to dispatch ``Dispatch.MEGATRON_COMPUTE`` calls.
    A layer whose output is all-reduced asynchronously (RowwiseParallel) returns an
    AsyncCollectiveTensor: wait for it before returning it from a method, or Ray ships this rank's
    partial sum (see ``verl_compat.models.llama.megatron.layers``).
    """

    def __init__(self) -> None:
        super().__init__()
        self._device_mesh: DeviceMesh | None = None

    def init_model_parallel(
        self, tensor_model_parallel_size: int = 1, pipeline_model_parallel_size: int = 1
    ) -> DeviceMesh:
        """Join the process group (unless user code already did) and build the (pp, dp, tp) mesh."""
        global _MESH
        shape = model_parallel_shape(self.world_size, tensor_model_parallel_size, pipeline_model_parallel_size)
        self.init_process_group()
        self._device_mesh = _MESH = init_device_mesh(self.device.type, shape, mesh_dim_names=MESH_DIM_NAMES)
        return self._device_mesh

    @property
    def device_mesh(self) -> DeviceMesh:
        """The (pp, dp, tp) mesh; index it by name, e.g. ``self.device_mesh["tp"]``."""
        if self._device_mesh is None:
            raise RuntimeError(
                f"{type(self).__name__} has no device mesh: call self.init_model_parallel("
                "tensor_model_parallel_size=..., pipeline_model_parallel_size=...) in __init__"
            )
        return self._device_mesh

    def get_megatron_rank_info(self) -> DistRankInfo:
        """This rank's tp, dp and pp ranks."""
        mesh = self.device_mesh
        return DistRankInfo(*(mesh.get_local_rank(name) for name in ("tp", "dp", "pp")))

    def get_megatron_global_info(self) -> DistGlobalInfo:
        """The tp, dp and pp sizes of the mesh."""
        mesh = self.device_mesh
        return DistGlobalInfo(*(mesh.size(MESH_DIM_NAMES.index(name)) for name in ("tp", "dp", "pp")))


MegatronWorker = TensorParallelWorker  # the seed's name


def model_parallel_mesh() -> DeviceMesh:
    """The (pp, dp, tp) mesh this process's worker built (what the seeds' layers find through Megatron's ``mpu``)."""
    if _MESH is None:
        raise RuntimeError("no model-parallel mesh in this process: call self.init_model_parallel(...) in the worker")
    return _MESH
