"""``Worker``: the base class of every process a worker group starts.

A worker learns who it is from environment variables that its worker group sets before the process
starts (the ones ``torchrun`` sets): ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT``. Its device is what Ray gave the process: ``cuda:<id>`` when the
actor holds a GPU (a group on a ``use_gpu`` pool asks for one), or a local group's worker was given one, else ``cpu``.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

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
        device = device_for(_gpus_ray_assigned())
        if device.type == "cuda":
            self._local_rank = device.index
            os.environ["LOCAL_RANK"] = str(device.index)
            torch.cuda.set_device(device)
        return device

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
        """``cuda:<local_rank>`` when Ray gave this process a GPU, else ``cpu``."""
        return self._device

    def init_process_group(self, timeout_s: float = 600.0) -> None:
        """Join this group's ``torch.distributed`` world (nccl on CUDA, gloo on CPU); no-op if joined."""
        if dist.is_initialized():
            return
        dist.init_process_group(
            init_method=f"tcp://{self._master_addr}:{self._master_port}",
            rank=self._rank,
            world_size=self._world_size,
            timeout=timedelta(seconds=timeout_s),
            **process_group_backend(self._device),
        )

    def whoami(self) -> dict:
        """Rank, pid and node of this process (used in tests and error reports)."""
        import socket

        return {"rank": self._rank, "pid": os.getpid(), "host": socket.gethostname(), "device": str(self._device)}


def device_for(gpu_ids: list) -> torch.device:
    """The device of a worker that Ray gave ``gpu_ids``: ``cuda:<first id>`` when it has a GPU and CUDA is
    visible, else ``cpu``. The group asks Ray not to narrow CUDA_VISIBLE_DEVICES, so every GPU of the node is
    visible (NCCL peer-to-peer needs that) and the id Ray gave is the device's index (the worker's LOCAL_RANK)."""
    if not gpu_ids or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", int(gpu_ids[0]))


def process_group_backend(device: torch.device) -> dict:
    """``init_process_group``'s backend for a worker on ``device``: nccl bound to its GPU on CUDA, else gloo."""
    if device.type == "cuda":
        return {"backend": "nccl", "device_id": device}
    return {"backend": "gloo", "device_id": None}


def _gpus_ray_assigned() -> list:
    """The GPU ids Ray assigned to this actor; a local group's (``WG_LOCAL_GPU``, single_controller/local.py) in
    the driver's process; none elsewhere (the driver, a plain process)."""
    if os.environ.get("WG_BACKEND") == "local":
        return [os.environ["WG_LOCAL_GPU"]] if "WG_LOCAL_GPU" in os.environ else []
    import ray

    if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return []
    return ray.get_gpu_ids()
