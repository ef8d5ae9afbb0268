"""``LocalWorkerGroup``: a one-rank worker group whose worker is an object of the driver's own process.

The same worker classes, ``@register`` dispatch and ``DataProto`` as ``RayWorkerGroup`` (both are
``base.worker_group.WorkerGroup``), without Ray: no placement groups, no object store, no second process. A call
runs the worker's method at once and its return value is the rank's output, so ``breakpoint()`` in worker code
stops in the user's terminal and a worker's exception arrives with its whole traceback. The worker reads the
environment a Ray worker is given (``RANK=0``, ``WORLD_SIZE=1``, a free ``MASTER_PORT``; ``WG_BACKEND=local``,
and ``WG_LOCAL_GPU`` for its CUDA device) and, on a CPU, computes with as many threads as a one-CPU Ray actor
(``OMP_NUM_THREADS``, else 1): the same kernels, so a deterministic run is bit-equal to its Ray run.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import socket
from typing import Any

import torch

from single_controller.base.colocate import WorkerDict, colocated_class
from single_controller.base.worker_group import ClassWithInitArgs, Target, WorkerGroup

__all__ = ["LocalWorkerGroup", "local_colocated_cls"]


class LocalWorkerGroup(WorkerGroup):
    """One worker of ``cls_with_init`` built in this process; ``device_name`` ``"cuda"`` puts it on GPU 0;
    ``worker_env`` is set in this process's environment before the worker is built."""

    def __init__(
        self, cls_with_init: ClassWithInitArgs, device_name: str = "cpu", worker_env: dict[str, str] | None = None
    ) -> None:
        super().__init__(cls_with_init)
        with socket.socket() as sock:  # a one-rank process group still rendezvous over TCP
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
        env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WG_PREFIX": "local", "WG_BACKEND": "local"}
        if device_name == "cuda":
            env["WG_LOCAL_GPU"] = "0"
        else:  # a Ray actor holding one CPU computes with OMP_NUM_THREADS threads (Ray sets 1)
            torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        os.environ.update({**(worker_env or {}), **env})
        self._loop = asyncio.new_event_loop()  # an async worker's methods share one loop, as in a Ray async actor
        self._workers = [cls_with_init.user_cls(*cls_with_init.args, **cls_with_init.kwargs)]
        self.processes = [
            {"pid": os.getpid(), "node_ip": "127.0.0.1", "node_id": "local", "host": socket.gethostname()}
        ]

    def _call(self, worker: Any, target: Target, args: tuple, kwargs: dict) -> Any:
        if target.role is None:
            result = getattr(worker, target.method)(*args, **kwargs)
        else:
            result = getattr(worker.worker_dict[target.role], target.method)(*args, **kwargs)
        return self._loop.run_until_complete(result) if inspect.isawaitable(result) else result

    def wait(self, outputs: Any, call_name: str) -> Any:
        return outputs  # already computed: the call ran when it was submitted

    def get(self, outputs: Any) -> Any:
        return outputs

    def shutdown(self) -> None:
        """Drop the worker (its models and optimizer state) and the process group it joined."""
        import torch.distributed as dist

        self._workers.clear()
        if dist.is_initialized():
            dist.destroy_process_group()
        if not self._loop.is_closed():
            self._loop.close()


def local_colocated_cls(class_dict: dict[str, ClassWithInitArgs]) -> ClassWithInitArgs:
    """A ``WorkerDict`` of every role of ``class_dict``, to build in this process (``LocalWorkerGroup``)."""
    return ClassWithInitArgs(colocated_class(WorkerDict, class_dict, "WorkerDict"))
