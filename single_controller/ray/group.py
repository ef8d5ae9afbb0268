"""``RayWorkerGroup``: one Ray actor per bundle of a resource pool, called as one.

A group starts its workers (``_start_workers``: the environment each one reads is set there), then gets
its methods from the workers' ``@register``-ed methods (single_controller/base/worker_group.py, the one place
method names are decided, shared with the local group). ``spawn`` gives the per-role views of a colocated group.
Further group methods that only ported code calls (``from_detached``, ``fuse``, mesh queries) are the door
package's, never this module's.
"""

from __future__ import annotations

import socket
import uuid

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from single_controller.base.worker_group import Target, WorkerGroup
from single_controller.ray.health import describe_processes, get_alive
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


class RayWorkerGroup(WorkerGroup):
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
        self.name_prefix = name_prefix if name_prefix is not None else uuid.uuid4().hex[:6]
        self._master_addr = self._master_port = None
        super().__init__(ray_cls_with_init)
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
                # the names ported workers read: the local rank and size as Ray places them, and the group's identity
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

    # ---------------------------------------------------------------- execution
    def _call(self, worker, target: Target, args: tuple, kwargs: dict):
        if target.role is None:
            return getattr(worker, target.method).remote(*args, **kwargs)
        return worker.execute_role.remote(target.role, target.method, *args, **kwargs)

    def wait(self, outputs, call_name: str):
        """``ray.get`` that fails fast on a dead worker and names it (ray/health.py)."""
        return get_alive(outputs, call_name, self.processes)

    def get(self, outputs):
        return ray.get(outputs)


def _uses_gpu(pool: RayResourcePool, device_name: str | None) -> bool:
    """Whether the workers compute on GPUs: ``device_name`` if given (checked against the pool), else the pool's."""
    if device_name is None:
        return pool.use_gpu
    if device_name not in ("cuda", "cpu"):
        raise ValueError(f"device_name={device_name!r} is not supported; valid: 'cuda', 'cpu' (or None: the pool's)")
    if device_name == "cuda" and not pool.use_gpu:
        raise ValueError(f"device_name='cuda' needs a pool with use_gpu=True; {pool!r} reserves no GPUs")
    return device_name == "cuda"
