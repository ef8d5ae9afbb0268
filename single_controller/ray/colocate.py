"""Colocation: several worker roles in one process, each role a view of one worker group."""

from __future__ import annotations

import inspect
from typing import Any

import ray

from single_controller.base.decorator import MAGIC_ATTR
from single_controller.base.worker import Worker
from single_controller.ray.placement import RayClassWithInitArgs

__all__ = ["create_colocated_worker_cls"]


def create_colocated_worker_cls(class_dict: dict[str, RayClassWithInitArgs]) -> RayClassWithInitArgs:
    """One ``WorkerDict`` class that holds every role of ``class_dict`` in one process.

    ``WorkerDict`` builds each role's worker in its own ``__init__`` and exposes each registered
    method ``m`` of role ``key`` as ``key_m``; ``RayWorkerGroup.spawn`` then gives per-role views.
    """
    specs = {key: (cia.user_cls, cia.args, cia.kwargs) for key, cia in class_dict.items()}
    methods: dict[str, Any] = {"__init__": _worker_dict_init}
    for key, (cls, _, _) in specs.items():
        if not issubclass(cls, Worker):
            raise TypeError(f"role {key!r}: {cls.__name__} must subclass single_controller.base.Worker")
        for name in dir(cls):
            method = getattr(cls, name, None)
            attrs = getattr(method, MAGIC_ATTR, None)
            if attrs is not None:
                methods[f"{key}_{name}"] = _delegate(key, name, method, attrs)
    worker_dict_cls = type("WorkerDict", (Worker,), methods)
    return RayClassWithInitArgs(ray.remote(worker_dict_cls), specs)


def _worker_dict_init(self, specs: dict) -> None:
    Worker.__init__(self)
    # Each role reads the same RANK/WORLD_SIZE env, so every role sees this process's rank.
    self.worker_dict = {key: cls(*args, **kwargs) for key, (cls, args, kwargs) in specs.items()}


def _delegate(key: str, name: str, method, attrs: dict):
    if inspect.iscoroutinefunction(method):

        async def call(self, *args, **kwargs):
            return await getattr(self.worker_dict[key], name)(*args, **kwargs)
    else:

        def call(self, *args, **kwargs):
            return getattr(self.worker_dict[key], name)(*args, **kwargs)

    call.__name__ = f"{key}_{name}"
    setattr(call, MAGIC_ATTR, attrs)
    return call
