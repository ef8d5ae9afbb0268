"""verl's ``verl.single_controller.base.worker``: verl's ``Worker``, the core's (single_controller/base/worker.py) with
the methods the trainer does not use.

- n-d dispatch meshes: a rank declares its dp rank in a named mesh and whether its results are collected
  (``_register_dispatch_collect_info``); worker groups ask with ``_query_dispatch_info`` /
  ``_query_collect_info`` (base/decorator.py ``make_nd_compute_dataproto_dispatch_fn``).
  ``get_dispatch_collect`` / ``set_dispatch_collect`` copy a worker's declaration to another one under a
  new mesh name (a worker holding several roles declares each role's mesh).
- verl's built-in group methods ``execute_func_rank_zero`` and ``execute_with_func_generator``.
- ``get_master_addr_port``, ``get_cuda_visible_devices``, ``get_fused_worker_by_name``: verl's accessors.
"""

from __future__ import annotations

import os
from typing import Any

from single_controller.base.register import Execute, register
from single_controller.base.worker import Worker as CoreWorker
from single_controller.errors import ContractError
from verl_compat.single_controller.base.decorator import Dispatch

__all__ = ["Worker"]


class Worker(CoreWorker):
    """verl's Worker: the core's, with verl's methods beyond what the trainer uses (every verl path of ``Worker``
    gives this class)."""

    # ---------------------------------------------------------------- n-d dispatch meshes
    def _meshes(self) -> tuple[dict[str, int], dict[str, bool]]:
        # __dict__.setdefault: a subclass that skips Worker.__init__ may still declare meshes
        return self.__dict__.setdefault("_dispatch_dp_rank", {}), self.__dict__.setdefault("_collect_dp_rank", {})

    def _register_dispatch_collect_info(self, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        """Declare this rank's dp rank in ``mesh_name`` and whether its results are collected (once per mesh)."""
        dispatch, collect = self._meshes()
        if mesh_name in dispatch:
            raise ContractError(f"mesh_name {mesh_name!r} has been registered already (dp_rank {dispatch[mesh_name]})")
        dispatch[mesh_name], collect[mesh_name] = int(dp_rank), bool(is_collect)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_dispatch_info(self, mesh_name: str) -> int:
        """This rank's dp rank in ``mesh_name``."""
        return self._declared(mesh_name)[0]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_collect_info(self, mesh_name: str) -> bool:
        """Whether this rank's results are collected in ``mesh_name``."""
        return self._declared(mesh_name)[1]

    def query_collect_info(self, mesh_name: str) -> bool:
        return self._declared(mesh_name)[1]

    def _declared(self, mesh_name: str) -> tuple[int, bool]:
        dispatch, collect = self._meshes()
        if mesh_name not in dispatch:
            raise ContractError(
                f"{type(self).__name__} rank {os.environ.get('RANK')} declared no mesh {mesh_name!r} "
                f"(declared: {sorted(dispatch)}); "
                f"call self._register_dispatch_collect_info({mesh_name!r}, dp_rank, is_collect)"
            )
        return dispatch[mesh_name], collect[mesh_name]

    def get_dispatch_collect(self) -> dict[str, dict]:
        """``{"dispatch_dp_rank": {mesh: dp_rank}, "collect_dp_rank": {mesh: is_collect}}`` of every declared mesh."""
        dispatch, collect = self._meshes()
        return {"dispatch_dp_rank": dispatch, "collect_dp_rank": collect}

    def set_dispatch_collect(
        self, mesh_name: str, dispatch_dp_rank: dict[str, int], collect_dp_rank: dict[str, bool]
    ) -> None:
        """Declare ``mesh_name`` with another worker's declaration (``**other.get_dispatch_collect()``).

        As in verl, the other worker declares one mesh; its dp rank and collect flag are copied under
        ``mesh_name``, which this worker must not have declared yet.
        """
        dispatch, collect = self._meshes()
        if mesh_name in dispatch:
            raise ContractError(f"mesh_name {mesh_name!r} has been registered already; declared: {sorted(dispatch)}")
        for dp_rank in dispatch_dp_rank.values():
            dispatch[mesh_name] = dp_rank
        for is_collect in collect_dp_rank.values():
            collect[mesh_name] = is_collect

    # ---------------------------------------------------------------- verl's built-in group methods
    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def execute_func_rank_zero(self, func, *args, **kwargs):
        """Run ``func(*args, **kwargs)`` in rank 0's process."""
        return func(*args, **kwargs)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def execute_with_func_generator(self, func, *args, **kwargs):
        """Run ``func(self, chunk, ...)`` on every rank with its chunk of the DataProto arguments."""
        return func(self, *args, **kwargs)

    # ---------------------------------------------------------------- accessors
    def get_master_addr_port(self) -> tuple[str, str]:
        """The rendezvous address of this worker's group (``MASTER_ADDR``, ``MASTER_PORT``)."""
        return self._master_addr, self._master_port

    def get_cuda_visible_devices(self) -> str:
        return os.environ.get("CUDA_VISIBLE_DEVICES", "not set")

    def get_fused_worker_by_name(self, worker_name: str) -> Any:
        """The worker of role ``worker_name`` in this fused process (``create_colocated_worker_raw_cls``), or None."""
        return self.__dict__.get("fused_worker_dict", {}).get(worker_name)
