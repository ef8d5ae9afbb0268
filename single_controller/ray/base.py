"""Ray back end of the single controller: worker groups and method binding.

``RayWorkerGroup`` starts one Ray actor per bundle of a resource pool (single_controller/ray/placement.py)
and turns every ``@register``-ed worker method into a group method (see ``_bind_worker_methods``: the one
place where that happens). Colocated roles: single_controller/ray/colocate.py.
"""

from __future__ import annotations

import socket
import uuid

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from single_controller.base.decorator import MAGIC_ATTR, PADDED_MODES, Execute, get_dispatch_fns, proto_pad_size
from single_controller.protocol import DataProto, DataProtoFuture
from single_controller.ray.colocate import create_colocated_worker_cls
from single_controller.ray.health import describe_processes, get_alive
from single_controller.ray.placement import (
    RayClassWithInitArgs,
    RayResourcePool,
    ResourceUnavailableError,
    merge_resource_pool,
)

__all__ = [
    "ResourceUnavailableError",
    "RayResourcePool",
    "RayClassWithInitArgs",
    "RayWorkerGroup",
    "merge_resource_pool",
    "create_colocated_worker_cls",
]


# max_calls=1: the process that ran it exits, instead of idling beside the workers for the whole run (an idle
# Ray worker wakes ~100 times a second, preempting the workers' compute threads on a small CPU machine)
@ray.remote(num_cpus=0, max_calls=1)
def _node_address_and_free_port() -> tuple[str, int]:
    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    return ray.util.get_node_ip_address(), port


class RayWorkerGroup:
    """One Ray actor per bundle of ``resource_pool``; ranks follow bundle order.

    Each actor is named ``<name_prefix>_<class>_<rank>`` (``worker_names``); with ``detached`` the
    actors outlive this driver, and another process attaches to them by name (``worker_names``,
    or :meth:`from_detached`) or by handle (``worker_handles``) instead of giving a resource pool.
    ``device_name`` (``"cuda"`` or ``"cpu"``) is the workers' device; by default the pool's.
    """

    def __init__(
        self,
        resource_pool: RayResourcePool | None = None,
        ray_cls_with_init: RayClassWithInitArgs | None = None,
        name_prefix: str | None = None,
        detached: bool = False,
        worker_names: list[str] | None = None,
        worker_handles: list | None = None,
        device_name: str | None = None,
        start_timeout_s: float = 300.0,
    ) -> None:
        if ray_cls_with_init is None:
            raise ValueError("RayWorkerGroup needs ray_cls_with_init (the worker class, to bind its methods)")
        self.resource_pool = resource_pool
        self.ray_cls_with_init = ray_cls_with_init
        self.name_prefix = name_prefix if name_prefix is not None else uuid.uuid4().hex[:6]
        if worker_names is not None or worker_handles is not None:
            self._workers = list(worker_handles) if worker_handles is not None else [ray.get_actor(n) for n in worker_names]
            self._worker_names = list(worker_names) if worker_names is not None else [None] * len(self._workers)
        elif resource_pool is None:
            raise ValueError("RayWorkerGroup needs a resource_pool to start workers, or worker_names/worker_handles to attach to")
        else:
            use_gpu = _uses_gpu(resource_pool, device_name)
            self._worker_names = [f"{self.name_prefix}_{ray_cls_with_init.user_cls.__name__}_{rank}" for rank in range(resource_pool.world_size)]
            self._workers = self._start_workers(use_gpu, detached, start_timeout_s)
        self.processes = describe_processes(self._workers)  # pid and node per rank, for error reports
        self._mesh_info: dict[str, tuple[list[int], list[bool]]] = {}
        self._bind_worker_methods(ray_cls_with_init.user_cls)

    @classmethod
    def from_detached(
        cls,
        name_prefix: str | None = None,
        worker_names: list[str] | None = None,
        worker_handles: list | None = None,
        ray_cls_with_init: RayClassWithInitArgs | None = None,
    ) -> RayWorkerGroup:
        """A group of running (detached) workers, found by name or handle."""
        return cls(ray_cls_with_init=ray_cls_with_init, name_prefix=name_prefix, worker_names=worker_names, worker_handles=worker_handles)

    @property
    def world_size(self) -> int:
        return len(self._workers)

    @property
    def workers(self) -> list:
        return self._workers

    @property
    def worker_names(self) -> list[str | None]:
        """The Ray actor names, in rank order (``ray.get_actor(name)`` finds a worker)."""
        return self._worker_names

    # ---------------------------------------------------------------- start-up
    def _start_workers(self, use_gpu: bool, detached: bool, start_timeout_s: float) -> list:
        pool = self.resource_pool
        pgs = pool.get_placement_groups()
        addr, port = ray.get(
            _node_address_and_free_port.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pgs[0], placement_group_bundle_index=0)
            ).remote()
        )
        share = 1 / pool.max_colocate_count
        resources = {"num_cpus": pool.cpus_per_bundle * share, **({"num_gpus": share} if pool.use_gpu else {})}
        workers, rank = [], 0
        for pg, local_world_size in zip(pgs, pool.process_on_nodes):
            for local_rank in range(local_world_size):
                env = {
                    "RANK": str(rank),
                    "WORLD_SIZE": str(pool.world_size),
                    "LOCAL_RANK": str(local_rank),
                    "LOCAL_WORLD_SIZE": str(local_world_size),
                    "MASTER_ADDR": addr,
                    "MASTER_PORT": str(port),
                    "COLORL_USE_GPU": "1" if use_gpu else "0",
                }
                if pool.use_gpu:
                    env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"
                try:
                    workers.append(self.ray_cls_with_init(pg, local_rank, env, resources, self._worker_names[rank], detached))
                except ValueError as exc:  # Ray's "actor name already taken"
                    for worker in workers:
                        ray.kill(worker, no_restart=True)
                    raise ValueError(f"cannot start worker {self._worker_names[rank]!r} ({exc}); use another name_prefix") from exc
                rank += 1
        # Surface constructor errors now, not at the first method call.
        ray.get([w.__ray_ready__.remote() for w in workers], timeout=start_timeout_s)
        return workers

    def query_mesh(self, mesh_name: str) -> tuple[list[int], list[bool]]:
        """Per rank, its dp rank in ``mesh_name`` and whether it reports results (asked once, then cached)."""
        if mesh_name not in self._mesh_info:
            infos = get_alive(self.execute_all_async("_query_dispatch_collect_info", mesh_name), "query_mesh", self.processes)
            self._mesh_info[mesh_name] = ([dp for dp, _ in infos], [collect for _, collect in infos])
        return self._mesh_info[mesh_name]

    # ---------------------------------------------------------------- method binding
    def _bind_worker_methods(self, user_cls: type, prefix: str | None = None) -> list[str]:
        """Make every ``@register``-ed method of ``user_cls`` a method of this group.

        With ``prefix`` (a role view of a colocated group), only methods named ``<prefix>_<name>``
        are bound, under ``<name>``.
        """
        bound = []
        for attr_name in dir(user_cls):
            attrs = getattr(getattr(user_cls, attr_name, None), MAGIC_ATTR, None)
            if attrs is None:
                continue
            if prefix is None:
                public_name = attr_name
            elif attr_name.startswith(prefix + "_"):
                public_name = attr_name[len(prefix) + 1 :]
            else:
                continue
            if hasattr(type(self), public_name):
                raise ValueError(f"worker method {attr_name!r} would shadow RayWorkerGroup.{public_name}; rename it")
            setattr(self, public_name, self._group_method(attr_name, public_name, attrs))
            bound.append(public_name)
        return bound

    def _group_method(self, method_name: str, public_name: str, attrs: dict):
        """dispatch -> execute on the ranks -> (get, failing fast on a dead worker) -> collect -> undo padding."""
        fns = get_dispatch_fns(attrs["dispatch_mode"])
        role = method_name[: -len(public_name) - 1] or self.ray_cls_with_init.user_cls.__name__
        call = f"{role}.{public_name}"  # e.g. actor_rollout.update_actor, for error reports
        execute = self.execute_rank_zero_async if attrs["execute_mode"] is Execute.RANK_ZERO else self.execute_all_async
        # rows are padded to a multiple of pad_divisor(group): a custom mode may name one (the n-d mode does)
        pad_divisor = fns.get("pad_divisor") or (_world_size if attrs["dispatch_mode"] in PADDED_MODES else None)

        def group_method(*args, **kwargs):
            pad = proto_pad_size(pad_divisor(self), args, kwargs) if pad_divisor else 0
            rows = next((len(a) for a in (*args, *kwargs.values()) if isinstance(a, DataProto)), 0)
            args, kwargs = fns["dispatch_fn"](self, *args, **kwargs)
            outputs = execute(method_name, *args, **kwargs)
            if attrs["blocking"]:
                outputs = get_alive(outputs, call, self.processes)
            result = fns["collect_fn"](self, outputs)
            return _trim(result, keep=rows) if pad else result

        group_method.__name__ = public_name
        return group_method

    # ---------------------------------------------------------------- execution
    def _args_for_rank(self, rank: int, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Rank i gets item i when every argument is a list of length world_size, else all of them."""
        values = [*args, *kwargs.values()]
        if values and all(isinstance(v, list) and len(v) == self.world_size for v in values):
            return tuple(a[rank] for a in args), {k: v[rank] for k, v in kwargs.items()}
        return args, kwargs

    def execute_all_async(self, method_name: str, *args, **kwargs) -> list:
        refs = []
        for rank, worker in enumerate(self._workers):
            a, kw = self._args_for_rank(rank, args, kwargs)
            refs.append(getattr(worker, method_name).remote(*a, **kw))
        return refs

    def execute_all_sync(self, method_name: str, *args, **kwargs) -> list:
        return ray.get(self.execute_all_async(method_name, *args, **kwargs))

    execute_all = execute_all_async

    def execute_rank_zero_async(self, method_name: str, *args, **kwargs):
        a, kw = self._args_for_rank(0, args, kwargs)
        return getattr(self._workers[0], method_name).remote(*a, **kw)

    def execute_rank_zero_sync(self, method_name: str, *args, **kwargs):
        return ray.get(self.execute_rank_zero_async(method_name, *args, **kwargs))

    execute_rank_zero = execute_rank_zero_async

    # ---------------------------------------------------------------- colocated roles
    def spawn(self, prefix_set) -> dict[str, RayWorkerGroup]:
        """Per-role views of a colocated group: ``spawn(["actor"])["actor"].add`` calls ``actor_add``."""
        views = {}
        for prefix in prefix_set:
            view = object.__new__(type(self))
            view.__dict__.update({k: v for k, v in self.__dict__.items() if not callable(v)})
            view._bind_worker_methods(self.ray_cls_with_init.user_cls, prefix=prefix)
            views[prefix] = view
        return views


def _world_size(worker_group: RayWorkerGroup) -> int:
    return worker_group.world_size


def _uses_gpu(pool: RayResourcePool, device_name: str | None) -> bool:
    """Whether the workers compute on GPUs: ``device_name`` if given (checked against the pool), else the pool's."""
    if device_name is None:
        return pool.use_gpu
    if device_name not in ("cuda", "cpu"):
        raise ValueError(f"device_name={device_name!r} is not supported; valid: 'cuda', 'cpu' (or None: the pool's)")
    if device_name == "cuda" and not pool.use_gpu:
        raise ValueError(f"device_name='cuda' needs a pool with use_gpu=True; {pool!r} reserves no GPUs")
    return device_name == "cuda"


def _trim(result, keep: int):
    """Drop the rows that dispatch padding added."""
    if isinstance(result, DataProto):
        return result[:keep]
    if isinstance(result, DataProtoFuture):
        return DataProtoFuture(result.futures, keep=keep)
    return result
