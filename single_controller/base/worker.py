"""``Worker``: the base class of every process a worker group starts.

A worker learns who it is from environment variables that its worker group sets before the
process starts (the same ones ``torchrun`` sets): ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from single_controller.base.decorator import Dispatch, Execute, register

ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class Worker:
    """Base class for worker-group processes: rank, world size, device, process-group set-up."""

    def __init__(self) -> None:
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise RuntimeError(
                f"{type(self).__name__} needs the environment variables {missing}; "
                "create it through a RayWorkerGroup (or set them as torchrun does)"
            )
        self._rank = int(os.environ["RANK"])
        self._world_size = int(os.environ["WORLD_SIZE"])
        self._local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self._local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        self._master_addr = os.environ["MASTER_ADDR"]
        self._master_port = os.environ["MASTER_PORT"]
        self._device = self._pick_device()

    def _pick_device(self) -> torch.device:
        if os.environ.get("COLORL_USE_GPU") != "1" or not torch.cuda.is_available():
            return torch.device("cpu")
        # The group asks Ray not to narrow CUDA_VISIBLE_DEVICES, so every GPU of the node is visible
        # (NCCL peer-to-peer needs that) and LOCAL_RANK is the index of the GPU Ray gave this worker.
        import ray

        gpu_ids = ray.get_gpu_ids()
        if gpu_ids:
            self._local_rank = int(gpu_ids[0])
            os.environ["LOCAL_RANK"] = str(self._local_rank)
        torch.cuda.set_device(self._local_rank)
        return torch.device("cuda", self._local_rank)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def local_rank(self) -> int:
        return self._local_rank

    @property
    def local_world_size(self) -> int:
        return self._local_world_size

    @property
    def device(self) -> torch.device:
        """``cuda:<local_rank>`` in a GPU group, else ``cpu``."""
        return self._device

    def get_master_addr_port(self) -> tuple[str, str]:
        return self._master_addr, self._master_port

    def init_process_group(self, timeout_s: float = 600.0) -> None:
        """Join this group's ``torch.distributed`` world (nccl on CUDA, gloo on CPU); no-op if joined."""
        if dist.is_initialized():
            return
        backend = "nccl" if self._device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{self._master_addr}:{self._master_port}",
            rank=self._rank,
            world_size=self._world_size,
            timeout=timedelta(seconds=timeout_s),
            device_id=self._device if backend == "nccl" else None,
        )

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def execute_func_rank_zero(self, func, *args, **kwargs):
        """Run ``func(*args, **kwargs)`` in rank 0's process."""
        return func(*args, **kwargs)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def execute_with_func_generator(self, func, *args, **kwargs):
        """Run ``func(self, chunk, ...)`` on every rank with its chunk of the DataProto arguments."""
        return func(self, *args, **kwargs)

    # ---------------------------------------------------------------- n-d dispatch (verl's device-mesh API)
    def _register_dispatch_collect_info(self, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        """Declare this rank's data-parallel rank in ``mesh_name`` and whether its results are collected.

        Read by ``make_nd_compute_dataproto_dispatch_fn(mesh_name)`` methods (every rank must declare).
        """
        # __dict__.setdefault: subclasses that skip Worker.__init__ may still declare meshes
        self.__dict__.setdefault("_dispatch_meshes", {})[mesh_name] = (int(dp_rank), bool(is_collect))

    def _query_dispatch_collect_info(self, mesh_name: str) -> tuple[int, bool]:
        meshes = self.__dict__.get("_dispatch_meshes", {})
        if mesh_name not in meshes:
            raise ValueError(
                f"{type(self).__name__} rank {os.environ.get('RANK')} declared no mesh {mesh_name!r} "
                f"(declared: {sorted(meshes)}); call self._register_dispatch_collect_info({mesh_name!r}, dp_rank, is_collect)"
            )
        return meshes[mesh_name]

    def whoami(self) -> dict:
        """Rank, pid and node of this process (used in tests and error reports)."""
        import socket

        return {"rank": self._rank, "pid": os.getpid(), "host": socket.gethostname(), "device": str(self._device)}
