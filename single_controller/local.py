"""``LocalWorkerGroup``: a one-rank worker group whose worker is an object of the driver's own process.

The same worker classes, ``@register`` dispatch and ``DataProto`` as ``RayWorkerGroup`` (both are
``base.worker_group.WorkerGroup``), without Ray: no placement groups, no object store, no second process. A call
runs the worker's method at once and its return value is the rank's output, so ``breakpoint()`` in worker code
stops in the user's terminal and a worker's exception arrives with its whole traceback. The worker reads the
environment a Ray worker is given (``RANK=0``, ``WORLD_SIZE=1``, a free ``MASTER_PORT``; ``WG_BACKEND=local``,
and ``WG_LOCAL_GPU`` for its CUDA device). The worker keeps random generators of its own, as a process of its own
would: torch's (CPU and CUDA), NumPy's and Python's states are swapped in for each of its calls and out after it,
so the driver's draws (a data loader's seed) never move the worker's sampling, and a deterministic run is
bit-equal to its Ray run.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import random
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
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
        os.environ.update({**(worker_env or {}), **env})
        self._loop = asyncio.new_event_loop()  # an async worker's methods share one loop, as in a Ray async actor
        self._rng = _RandomState.fresh()
        with self._rng.swapped_in():
            self._workers = [cls_with_init.user_cls(*cls_with_init.args, **cls_with_init.kwargs)]
        self.processes = [
            {"pid": os.getpid(), "node_ip": "127.0.0.1", "node_id": "local", "host": socket.gethostname()}
        ]

    def _call(self, worker: Any, target: Target, args: tuple, kwargs: dict) -> Any:
        method = getattr(worker if target.role is None else worker.worker_dict[target.role], target.method)
        with self._rng.swapped_in():
            result = method(*args, **kwargs)
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


class _RandomState:
    """A worker's random generators: torch's CPU (and CUDA, once initialised), NumPy's and Python's states."""

    def __init__(self, torch_cpu: torch.Tensor, cuda: list | None, numpy: Any, python: Any) -> None:
        self.torch_cpu, self.cuda, self.numpy, self.python = torch_cpu, cuda, numpy, python

    @classmethod
    def fresh(cls) -> _RandomState:
        """The states a new Python process starts with: torch's default seed; NumPy and Python from the OS."""
        generator = torch.Generator().manual_seed(torch.default_generator.initial_seed())
        return cls(generator.get_state(), None, np.random.RandomState().get_state(), random.Random().getstate())

    @classmethod
    def current(cls) -> _RandomState:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        return cls(torch.get_rng_state(), cuda, np.random.get_state(), random.getstate())

    def install(self) -> None:
        torch.set_rng_state(self.torch_cpu)
        if self.cuda is not None and torch.cuda.is_initialized():
            torch.cuda.set_rng_state_all(self.cuda)
        np.random.set_state(self.numpy)
        random.setstate(self.python)

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Run the block on these states, then keep what it left and give the caller's back."""
        caller = _RandomState.current()
        self.install()
        try:
            yield
        finally:
            mine = _RandomState.current()
            self.torch_cpu, self.numpy, self.python = mine.torch_cpu, mine.numpy, mine.python
            self.cuda = mine.cuda if mine.cuda is not None else self.cuda
            caller.install()


def local_colocated_cls(class_dict: dict[str, ClassWithInitArgs]) -> ClassWithInitArgs:
    """A ``WorkerDict`` of every role of ``class_dict``, to build in this process (``LocalWorkerGroup``)."""
    return ClassWithInitArgs(colocated_class(WorkerDict, class_dict, "WorkerDict"))
