"""Ray back end of the single controller: resource pools, worker groups and method binding.

- ``RayResourcePool`` reserves one bundle per worker process (a placement group per node).
- ``RayClassWithInitArgs`` is a worker class plus the arguments to build it with.
- ``RayWorkerGroup`` starts one Ray actor per bundle and turns every ``@register``-ed worker
  method into a group method (see ``_bind_worker_methods``: the one place where that happens).
"""

from __future__ import annotations

import inspect
import socket
import uuid
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from single_controller.base.worker import Worker
from single_controller.base.decorator import MAGIC_ATTR, PADDED_MODES, Execute, get_dispatch_fns, proto_pad_size
from single_controller.protocol import DataProto, DataProtoFuture
from single_controller.ray.health import describe_processes, get_alive

__all__ = [
    "ResourceUnavailableError",
    "RayResourcePool",
    "RayClassWithInitArgs",
    "RayWorkerGroup",
    "merge_resource_pool",
    "create_colocated_worker_cls",
]


class ResourceUnavailableError(RuntimeError):
    """The Ray cluster cannot hold a resource pool."""


class RayResourcePool:
    """``process_on_nodes[i]`` worker processes on node i, one bundle each.

    A bundle is ``{"CPU": cpus_per_bundle, "GPU": 1}`` with GPUs and ``{"CPU": cpus_per_bundle}``
    without. Up to ``max_colocate_count`` actors (of different worker groups) may share a bundle.
    Placement groups are created on first use; if the cluster cannot hold them, this raises
    within ``placement_timeout_s`` instead of waiting forever.
    """

    def __init__(
        self,
        process_on_nodes: list[int] | None = None,
        use_gpu: bool = True,
        name_prefix: str | None = None,
        max_colocate_count: int = 10,
        cpus_per_bundle: float = 1,
        placement_timeout_s: float = 30.0,
    ) -> None:
        self.process_on_nodes = list(process_on_nodes or [1])
        if not self.process_on_nodes or any(int(n) <= 0 for n in self.process_on_nodes):
            raise ValueError(f"process_on_nodes must be positive process counts per node, got {process_on_nodes}")
        self.use_gpu = use_gpu
        self.name_prefix = name_prefix or uuid.uuid4().hex[:6]
        self.max_colocate_count = max_colocate_count
        self.cpus_per_bundle = cpus_per_bundle
        self.placement_timeout_s = placement_timeout_s
        self.pgs: list | None = None

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    @property
    def store(self) -> list[int]:
        return self.process_on_nodes

    def bundle(self) -> dict[str, float]:
        return {"CPU": self.cpus_per_bundle, **({"GPU": 1} if self.use_gpu else {})}

    def get_placement_groups(self) -> list:
        """The placement groups (one per node entry), created and waited for on first call."""
        if self.pgs is None:
            if not ray.is_initialized():
                ray.init()
            self._check_cluster_can_hold()
            pgs = [
                placement_group([self.bundle()] * n, strategy="STRICT_PACK", name=f"{self.name_prefix}_pg{i}")
                for i, n in enumerate(self.process_on_nodes)
            ]
            ready, _ = ray.wait([pg.ready() for pg in pgs], num_returns=len(pgs), timeout=self.placement_timeout_s)
            if len(ready) < len(pgs):
                for pg in pgs:
                    remove_placement_group(pg)
                raise ResourceUnavailableError(
                    f"{self!r} could not be placed within {self.placement_timeout_s:.0f}s: it asks for "
                    f"{self._asked()} and the cluster has {_cpu_gpu(ray.available_resources())} free "
                    f"(other worker groups may hold the rest)"
                )
            self.pgs = pgs
        return self.pgs

    def _asked(self) -> str:
        return ", ".join(f"{n} x {self.bundle()} on one node" for n in self.process_on_nodes)

    def _check_cluster_can_hold(self) -> None:
        """Fail at once when no node could ever hold a placement group (e.g. GPUs on a CPU-only machine)."""
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        for n in self.process_on_nodes:
            need = {k: v * n for k, v in self.bundle().items()}
            if not any(all(node.get(k, 0) >= v for k, v in need.items()) for node in nodes):
                have = [_cpu_gpu(node) for node in nodes]
                hint = (
                    "no GPU is visible to Ray: use use_gpu=False (trainer.device=cpu) or a machine with GPUs"
                    if self.use_gpu and not any(node.get("GPU", 0) for node in nodes)
                    else "start Ray with more resources (ray.init(num_cpus=...)) or ask for fewer processes"
                )
                raise ResourceUnavailableError(
                    f"{self!r} needs {need} on a single node, but the Ray cluster's nodes have {have}; {hint}"
                )

    def __repr__(self) -> str:
        return f"RayResourcePool({self.process_on_nodes}, use_gpu={self.use_gpu})"


def _cpu_gpu(resources: dict) -> dict:
    return {k: resources.get(k, 0) for k in ("CPU", "GPU")}


def merge_resource_pool(rp1: RayResourcePool, rp2: RayResourcePool) -> RayResourcePool:
    """A pool spanning both pools' bundles (ranks: rp1's first, then rp2's); shares their placement groups."""
    if rp1.use_gpu != rp2.use_gpu or rp1.max_colocate_count != rp2.max_colocate_count:
        raise ValueError("merge_resource_pool needs pools with the same use_gpu and max_colocate_count")
    merged = RayResourcePool(
        rp1.process_on_nodes + rp2.process_on_nodes,
        use_gpu=rp1.use_gpu,
        name_prefix=f"{rp1.name_prefix}_{rp2.name_prefix}",
        max_colocate_count=rp1.max_colocate_count,
        cpus_per_bundle=rp1.cpus_per_bundle,
    )
    merged.pgs = rp1.get_placement_groups() + rp2.get_placement_groups()
    return merged


class RayClassWithInitArgs:
    """A worker class (``ray.remote`` or plain) and the arguments to construct it with."""

    def __init__(self, cls: Any, *args, **kwargs) -> None:
        self.cls = cls if hasattr(cls, "__ray_actor_class__") else ray.remote(cls)
        self.args = args
        self.kwargs = kwargs
        self._options: dict[str, Any] = {}

    @property
    def user_cls(self) -> type:
        """The plain Python class behind the Ray actor class."""
        return self.cls.__ray_actor_class__

    def update_options(self, options: dict[str, Any]) -> None:
        self._options.update(options)

    def __call__(self, pg, bundle_index: int, env_vars: dict[str, str], resources: dict[str, float]):
        options = {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=bundle_index),
            "runtime_env": {"env_vars": env_vars},
            **resources,
            **self._options,
        }
        return self.cls.options(**options).remote(*self.args, **self.kwargs)


# max_calls=1: the process that ran it exits, instead of idling beside the workers for the whole run (an idle
# Ray worker wakes ~100 times a second, preempting the workers' compute threads on a small CPU machine)
@ray.remote(num_cpus=0, max_calls=1)
def _node_address_and_free_port() -> tuple[str, int]:
    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    return ray.util.get_node_ip_address(), port


class RayWorkerGroup:
    """One Ray actor per bundle of ``resource_pool``; ranks follow bundle order."""

    def __init__(self, resource_pool: RayResourcePool, ray_cls_with_init: RayClassWithInitArgs, start_timeout_s: float = 300.0) -> None:
        self.resource_pool = resource_pool
        self.ray_cls_with_init = ray_cls_with_init
        self._workers = self._start_workers(start_timeout_s)
        self.processes = describe_processes(self._workers)  # pid and node per rank, for error reports
        self._bind_worker_methods(ray_cls_with_init.user_cls)

    @property
    def world_size(self) -> int:
        return len(self._workers)

    @property
    def workers(self) -> list:
        return self._workers

    # ---------------------------------------------------------------- start-up
    def _start_workers(self, start_timeout_s: float) -> list:
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
                    "COLORL_USE_GPU": "1" if pool.use_gpu else "0",
                }
                if pool.use_gpu:
                    env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"
                workers.append(self.ray_cls_with_init(pg, local_rank, env, resources))
                rank += 1
        # Surface constructor errors now, not at the first method call.
        ray.get([w.__ray_ready__.remote() for w in workers], timeout=start_timeout_s)
        return workers

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
        padded = attrs["dispatch_mode"] in PADDED_MODES

        def group_method(*args, **kwargs):
            pad = proto_pad_size(self.world_size, args, kwargs) if padded else 0
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


def _trim(result, keep: int):
    """Drop the rows that dispatch padding added."""
    if isinstance(result, DataProto):
        return result[:keep]
    if isinstance(result, DataProtoFuture):
        return DataProtoFuture(result.futures, keep=keep)
    return result



# ---------------------------------------------------------------------------- colocation
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
