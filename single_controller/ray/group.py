"""``RayWorkerGroup``: one Ray actor per bundle of a resource pool, called as one.

A group starts its workers (``_start_workers``: the environment each one reads is set there), then gets
its methods from the workers' ``@register``-ed methods (single_controller/ray/binding.py, the one place
method names are decided). ``spawn`` gives the per-role views of a colocated group (ray/colocate.py).
verl's further group methods (``from_detached``, ``fuse``, mesh queries) are written in
single_controller/compat/worker_group.py; single_controller/ray/__init__.py adds them to the class.
"""

from __future__ import annotations

import copy
import socket
import uuid
from collections.abc import Iterable

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from single_controller.ray.binding import GroupMethod, Target, method_table
from single_controller.ray.health import describe_processes
from single_controller.ray.placement import RayClassWithInitArgs, RayResourcePool

__all__ = ["RayWorkerGroup"]


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
    ``worker_env`` adds environment variables to every worker (not the ones the group sets itself).
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
        worker_env: dict[str, str] | None = None,
        start_timeout_s: float = 300.0,
    ) -> None:
        if ray_cls_with_init is None:
            raise ValueError("RayWorkerGroup needs ray_cls_with_init (the worker class, to bind its methods)")
        self.resource_pool = resource_pool
        self.ray_cls_with_init = ray_cls_with_init
        self.name_prefix = name_prefix if name_prefix is not None else uuid.uuid4().hex[:6]
        self._role: str | None = None  # in a role view (spawn): the colocated role its calls run on
        self._master_addr = self._master_port = None
        self._methods = self._bind()  # before any worker starts: a name clash is refused at no cost
        if worker_names is not None or worker_handles is not None:
            self._workers = (
                list(worker_handles) if worker_handles is not None else [ray.get_actor(n) for n in worker_names]
            )
            self._worker_names = list(worker_names) if worker_names is not None else [None] * len(self._workers)
        elif resource_pool is None:
            raise ValueError(
                "RayWorkerGroup needs a resource_pool to start workers, or worker_names/worker_handles to attach to"
            )
        else:
            use_gpu = _uses_gpu(resource_pool, device_name)
            self._worker_names = [
                f"{self.name_prefix}_{ray_cls_with_init.user_cls.__name__}_{rank}"
                for rank in range(resource_pool.world_size)
            ]
            self._workers = self._start_workers(use_gpu, detached, worker_env or {}, start_timeout_s)
        self.processes = describe_processes(self._workers)  # pid and node per rank, for error reports

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
    def _start_workers(self, use_gpu: bool, detached: bool, worker_env: dict[str, str], start_timeout_s: float) -> list:
        pool = self.resource_pool
        bundles = pool.bundles()
        first = PlacementGroupSchedulingStrategy(
            placement_group=bundles[0].pg, placement_group_bundle_index=bundles[0].index
        )
        addr, port = ray.get(_node_address_and_free_port.options(scheduling_strategy=first).remote())
        self._master_addr, self._master_port = addr, str(port)
        share = 1 / pool.max_colocate_count
        resources = {"num_cpus": pool.cpus_per_bundle * share, **({"num_gpus": share} if use_gpu else {})}
        workers = []
        for rank, bundle in enumerate(bundles):
            env = {
                "RANK": str(rank),
                "WORLD_SIZE": str(len(bundles)),
                "LOCAL_RANK": str(bundle.local_rank),
                "LOCAL_WORLD_SIZE": str(bundle.local_world_size),
                "MASTER_ADDR": addr,
                "MASTER_PORT": str(port),
                # verl's names: the same local rank and size as Ray places them, and the group's identity
                "RAY_LOCAL_RANK": str(bundle.local_rank),
                "RAY_LOCAL_WORLD_SIZE": str(bundle.local_world_size),
                "WG_PREFIX": self.name_prefix,
                "WG_BACKEND": "ray",
            }
            if (
                use_gpu
            ):  # every GPU of the node stays visible (NCCL peer-to-peer); the worker picks Ray's (base/worker.py)
                env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"
            taken = sorted(set(worker_env) & set(env))
            if taken:
                raise ValueError(f"worker_env may not set {taken}: the worker group sets them (it sets {sorted(env)})")
            try:
                workers.append(
                    self.ray_cls_with_init(bundle, {**env, **worker_env}, resources, self._worker_names[rank], detached)
                )
            except ValueError as exc:  # Ray's "actor name already taken"
                for worker in workers:
                    ray.kill(worker, no_restart=True)
                raise ValueError(
                    f"cannot start worker {self._worker_names[rank]!r} ({exc}); use another name_prefix"
                ) from exc
        # Surface constructor errors now, not at the first method call.
        ray.get([w.__ray_ready__.remote() for w in workers], timeout=start_timeout_s)
        return workers

    # ---------------------------------------------------------------- methods
    def _bind(self) -> dict[str, GroupMethod]:
        """This group's methods, by name (single_controller/ray/binding.py)."""
        table = method_table(self.ray_cls_with_init.user_cls, self._role)
        for name, (target, _) in table.items():
            if hasattr(type(self), name):
                raise ValueError(
                    f"worker method {target.method!r} would shadow {type(self).__name__}.{name}; rename it"
                )
        return {name: GroupMethod(self, name, target, attrs) for name, (target, attrs) in table.items()}

    def __getattr__(self, name: str) -> GroupMethod:
        """A registered worker method, as a group method (found only when no attribute of the group has the name)."""
        methods = self.__dict__.get("_methods")  # absent while copy/pickle rebuild the object
        if methods is not None and name in methods:
            return methods[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __dir__(self) -> Iterable[str]:
        return [*super().__dir__(), *self.__dict__.get("_methods", {})]

    # ---------------------------------------------------------------- execution
    def submit(self, target: Target, ranks: Iterable[int], args: tuple, kwargs: dict) -> list:
        """Start ``target`` on ``ranks``; returns their ObjectRefs. Rank i gets item i of every argument when
        each argument is a list of world_size items, else all of them (verl's rule)."""
        refs = []
        for rank in ranks:
            a, kw = self._args_for_rank(rank, args, kwargs)
            worker = self._workers[rank]
            if target.role is None:
                refs.append(getattr(worker, target.method).remote(*a, **kw))
            else:
                refs.append(worker.execute_role.remote(target.role, target.method, *a, **kw))
        return refs

    def _args_for_rank(self, rank: int, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        values = [*args, *kwargs.values()]
        if values and all(isinstance(v, list) and len(v) == self.world_size for v in values):
            return tuple(a[rank] for a in args), {k: v[rank] for k, v in kwargs.items()}
        return args, kwargs

    def execute_all_async(self, method_name: str, *args, **kwargs) -> list:
        """Call ``method_name`` (any worker method, registered or not; in a role view, the role's) on every rank."""
        return self.submit(Target(self._role, method_name), range(self.world_size), args, kwargs)

    def execute_all_sync(self, method_name: str, *args, **kwargs) -> list:
        return ray.get(self.execute_all_async(method_name, *args, **kwargs))

    execute_all = execute_all_async

    def execute_rank_zero_async(self, method_name: str, *args, **kwargs):
        return self.submit(Target(self._role, method_name), [0], args, kwargs)[0]

    def execute_rank_zero_sync(self, method_name: str, *args, **kwargs):
        return ray.get(self.execute_rank_zero_async(method_name, *args, **kwargs))

    execute_rank_zero = execute_rank_zero_async

    # ---------------------------------------------------------------- colocated roles
    def spawn(self, prefix_set) -> dict[str, RayWorkerGroup]:
        """Per-role views of a colocated group: ``spawn(["actor"])["actor"].add`` runs the actor role's ``add``."""
        roles = getattr(self.ray_cls_with_init.user_cls, "raw_cls_dict", {})
        views = {}
        for role in prefix_set:
            if role not in roles:
                raise ValueError(
                    f"{role!r} is not a role of {self.ray_cls_with_init.user_cls.__name__}; its roles: {sorted(roles)}"
                )
            view = copy.copy(self)  # the same workers and processes
            view._role = role
            view._methods = view._bind()
            views[role] = view
        return views


def _uses_gpu(pool: RayResourcePool, device_name: str | None) -> bool:
    """Whether the workers compute on GPUs: ``device_name`` if given (checked against the pool), else the pool's."""
    if device_name is None:
        return pool.use_gpu
    if device_name not in ("cuda", "cpu"):
        raise ValueError(f"device_name={device_name!r} is not supported; valid: 'cuda', 'cpu' (or None: the pool's)")
    if device_name == "cuda" and not pool.use_gpu:
        raise ValueError(f"device_name='cuda' needs a pool with use_gpu=True; {pool!r} reserves no GPUs")
    return device_name == "cuda"
