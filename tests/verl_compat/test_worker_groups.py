"""verl's worker-group API beyond the trainer's, on a real Ray cluster: split pools (and splits of splits, each group
its own torch.distributed world), the environment workers see, fused colocated classes, n-d meshes declared per role
or copied between workers under per-method names, how group methods are named, and verl's class options."""

import os
import threading

import pytest
import ray
import torch

from single_controller.ray.health import shutdown_worker_group
from verl_compat import DataProto
from verl_compat.protocol import all_gather_data_proto
from verl_compat.single_controller.base import Worker
from verl_compat.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl_compat.single_controller.ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
    create_colocated_worker_raw_cls,
    split_resource_pool,
)

ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "RAY_LOCAL_RANK",
    "RAY_LOCAL_WORLD_SIZE",
    "WG_PREFIX",
    "EXTRA",
)


class Probe(Worker):
    def __init__(self, tag: int = 0) -> None:
        super().__init__()
        self.tag = tag
        self._register_dispatch_collect_info("half", dp_rank=self.rank // 2, is_collect=self.rank % 2 == 0)

    def env(self) -> dict:
        return {key: os.environ.get(key) for key in ENV} | {"device": str(self.device)}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def add_tag(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"x": data.batch["x"] + self.tag + self.rank})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("half"))
    def rows_seen(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(
            {"n": torch.full((len(data),), len(data)), "rank": torch.full((len(data),), self.rank)}
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def rank_later(self) -> int:
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def tagged_rank(self) -> int:
        return self.rank + self.tag

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def gathered(self) -> list:
        self.init_process_group()
        data = DataProto.from_dict(
            {"r": torch.full((self.rank + 1,), self.rank)}, {"s": [str(self.rank)] * (self.rank + 1)}
        )
        all_gather_data_proto(data)
        return data.batch["r"].tolist() + data.non_tensor_batch["s"].tolist()


class Scale(Worker):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def scale(self, x: float) -> float:
        return x * self.factor

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def scale_each(self, x: float) -> float:
        return x * self.factor

    def peek(self) -> float:  # not registered: reachable with execute_all_sync on a role view
        return self.factor


class Chain(
    create_colocated_worker_raw_cls(
        {"probe": RayClassWithInitArgs(Probe, tag=5), "scale": RayClassWithInitArgs(Scale, factor=2.0)}
    )
):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def scaled_rank(self) -> float:
        return self.scale.scale(self.fused_worker_dict["probe"].tagged_rank())


@pytest.fixture(scope="module")
def pool(ray_cluster):
    pool = RayResourcePool([2, 2], use_gpu=False, max_colocate_count=4)
    pool.get_placement_groups()
    return pool


# ---------------------------------------------------------------------------- split pools, environment
def test_split_pools_hold_their_own_groups_and_ranks(pool):
    first, rest = split_resource_pool(pool, [1, 3])
    one, three = (
        RayWorkerGroup(p, RayClassWithInitArgs(Probe, tag=10 * i), name_prefix=f"split{i}", worker_env={"EXTRA": "x"})
        for i, p in enumerate((first, rest))
    )
    envs = three.execute_all_sync("env")
    assert [e["RANK"] for e in envs] == ["0", "1", "2"] and {e["WORLD_SIZE"] for e in envs} == {"3"}
    # rest = bundle 1 of node 0, bundles 0-1 of node 1: local ranks count this group's ranks per node
    assert [(e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in envs] == [("0", "1"), ("0", "2"), ("1", "2")]
    assert all(
        e["RAY_LOCAL_RANK"] == e["LOCAL_RANK"] and e["RAY_LOCAL_WORLD_SIZE"] == e["LOCAL_WORLD_SIZE"] for e in envs
    )
    assert (
        {e["WG_PREFIX"] for e in envs} == {"split1"}
        and {e["EXTRA"] for e in envs} == {"x"}
        and {e["device"] for e in envs} == {"cpu"}
    )
    assert three.add_tag(DataProto.from_dict({"x": torch.zeros(3)})).batch["x"].tolist() == [10.0, 11.0, 12.0]
    assert three.gathered() == [[0, 1, 1, 2, 2, 2, "0", "1", "1", "2", "2", "2"]] * 3  # every rank's rows, rank order
    halves = split_resource_pool(rest, 1)  # a sub-pool splits again, from where it starts
    assert [h.bundles()[0].index for h in halves] == [1, 0, 1]
    shutdown_worker_group(one)  # a sub-pool's group goes; the pool it was cut from keeps its placement groups
    assert pool.pgs is not None and len(three.execute_all_sync("env")) == 3
    shutdown_worker_group(three)


def test_split_and_worker_env_refuse_what_cannot_work(pool):
    with pytest.raises(ValueError, match=r"sum up to world_size 4, got \[1, 2\]"):
        split_resource_pool(pool, [1, 2])
    with pytest.raises(AssertionError, match="divisor"):
        split_resource_pool(pool, 3)
    with pytest.raises(ValueError, match=r"may not set \['RANK'\]"):
        RayWorkerGroup(pool, RayClassWithInitArgs(Probe), worker_env={"RANK": "7"})
    with pytest.raises(ValueError, match=r"may not set \['RAY_LOCAL_WORLD_SIZE', 'WORLD_SIZE'\]"):
        RayWorkerGroup(pool, RayClassWithInitArgs(Probe), worker_env={"WORLD_SIZE": "9", "RAY_LOCAL_WORLD_SIZE": "9"})


# ---------------------------------------------------------------------------- colocation and method names
def test_fused_class_chains_roles_and_fuse_adds_role_views(pool):
    cls = RayClassWithInitArgs(Chain)
    cls.fused_worker_used = True  # verl's flag for a fused class: accepted, and ColoRL needs no flag
    group = RayWorkerGroup(pool, cls, name_prefix="fused")
    assert group.scaled_rank() == [10.0, 12.0, 14.0, 16.0]  # (rank + tag 5) * factor 2, in one call per rank
    assert not hasattr(group, "scale") and not hasattr(group, "probe_add_tag")  # fused: no <role>_<method> names
    group.fuse(["probe", "scale"])
    # the same chain through the driver: one role's per-rank answers, item i to rank i of the other role
    assert group.scale.scale_each(group.probe.tagged_rank()) == group.scaled_rank()
    assert group.scale.scale(1.5) == [3.0] * 4 and group.probe.rank_later() == [0, 1, 2, 3]
    assert group.scale.execute_all_sync("peek") == [2.0] * 4  # any method of the role, registered or not
    shutdown_worker_group(group)


def test_worker_dict_names_role_methods_and_views_see_their_role_only(pool):
    roles = {"probe": RayClassWithInitArgs(Probe, tag=1), "scale": RayClassWithInitArgs(Scale, factor=3.0)}
    group = RayWorkerGroup(pool, create_colocated_worker_cls(roles), name_prefix="dict")
    assert group.scale_scale(2.0) == [6.0] * 4 and "probe_add_tag" in dir(group)  # verl's names before spawn
    views = group.spawn(roles.keys())
    assert views["scale"].scale(1.0) == [3.0] * 4 and not hasattr(views["scale"], "add_tag")
    assert views["probe"].add_tag(DataProto.from_dict({"x": torch.zeros(4)})).batch["x"].tolist() == [
        1.0,
        2.0,
        3.0,
        4.0,
    ]
    assert views["probe"].rank_later() == [0, 1, 2, 3]  # an async role method, awaited in the colocated process
    # n-d dispatch in a role view: the mesh is the one the role declared (dp = rank // 2, even ranks report)
    out = views["probe"].rows_seen(DataProto.from_dict({"x": torch.zeros(3)}))
    assert out.batch["n"].tolist() == [2, 2, 2] and out.batch["rank"].tolist() == [0, 0, 2]
    with pytest.raises(ValueError, match="'judge' is not a role of WorkerDict"):
        group.spawn(["judge"])
    shutdown_worker_group(group)


def test_fused_class_from_the_helper_runs_roles_side_by_side(pool):
    roles = {"probe": RayClassWithInitArgs(Probe, tag=3), "scale": RayClassWithInitArgs(Scale, factor=10.0)}
    cls = create_colocated_worker_cls_fused(roles)
    group = RayWorkerGroup(split_resource_pool(pool, 2)[0], cls, name_prefix="fused_helper")
    group.fuse(roles.keys())
    assert group.scale.scale_each(group.probe.tagged_rank()) == [30.0, 40.0]
    # each role reaches the others of its process, as verl's get_fused_worker_by_name does
    assert [probe.tag for probe in group.scale.execute_all_sync("get_fused_worker_by_name", "probe")] == [3, 3]
    shutdown_worker_group(group)


class Shadowing(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def spawn(self):
        return None


def test_a_method_that_would_shadow_the_group_is_refused(pool):
    with pytest.raises(ValueError, match="would shadow RayWorkerGroup.spawn"):
        RayWorkerGroup(pool, RayClassWithInitArgs(Shadowing))


# ---------------------------------------------------------------------------- verl's class options
@ray.remote
class Meeting(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.barrier = threading.Barrier(2)

    def meet(self) -> bool:
        self.barrier.wait(timeout=60)  # returns only when two calls run at once in this actor
        return True


def test_update_options_reach_every_worker(pool):
    cls = RayClassWithInitArgs(Meeting)
    cls.update_options({"max_concurrency": 2})
    group = RayWorkerGroup(split_resource_pool(pool, 1)[0], cls)
    assert ray.get([group.execute_rank_zero_async("meet") for _ in range(2)], timeout=90) == [True, True]
    shutdown_worker_group(group)


@pytest.mark.gpu
def test_the_device_is_the_gpu_ray_assigned(ray_cluster):
    pool = RayResourcePool([1], use_gpu=True, max_colocate_count=2)
    on_gpu = RayWorkerGroup(pool, RayClassWithInitArgs(Probe), name_prefix="gpu")
    on_cpu = RayWorkerGroup(
        pool, RayClassWithInitArgs(Probe), name_prefix="cpu", device_name="cpu"
    )  # asks Ray for no GPU
    assert (
        on_gpu.execute_all_sync("env")[0]["device"].startswith("cuda:")
        and on_cpu.execute_all_sync("env")[0]["device"] == "cpu"
    )
    shutdown_worker_group(on_gpu)


# ---------------------------------------------------------------------------- dispatch meshes declared per method
def test_a_worker_takes_another_workers_mesh_under_a_new_name(monkeypatch):
    for key, value in {"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(key, value)  # a worker outside a group, set up as torchrun would
    rollout, ref, host = Worker(), Worker(), Worker()
    rollout._register_dispatch_collect_info("infer", dp_rank=3, is_collect=False)
    ref._register_dispatch_collect_info("infer", dp_rank=1, is_collect=True)
    host.set_dispatch_collect("rollout", **rollout.get_dispatch_collect())
    host.set_dispatch_collect("ref", **ref.get_dispatch_collect())
    assert (host.query_collect_info("rollout"), host.query_collect_info("ref")) == (False, True)
    assert host.get_dispatch_collect() == {
        "dispatch_dp_rank": {"rollout": 3, "ref": 1},
        "collect_dp_rank": {"rollout": False, "ref": True},
    }
    with pytest.raises(AssertionError, match="'ref' has been registered already"):
        host.set_dispatch_collect("ref", **rollout.get_dispatch_collect())
    with pytest.raises(AssertionError, match="declared no mesh 'critic'"):
        host.query_collect_info("critic")


class TwoMeshes(Probe):
    """Holds two inner workers with different layouts and takes each one's mesh under its own method's name."""

    def __init__(self) -> None:
        super().__init__()
        blocks, stripes = Worker(), Worker()
        blocks._register_dispatch_collect_info("mesh", dp_rank=self.rank // 2, is_collect=self.rank % 2 == 0)
        stripes._register_dispatch_collect_info("mesh", dp_rank=self.rank % 2, is_collect=self.rank < 2)
        self.set_dispatch_collect("blocks", **blocks.get_dispatch_collect())
        self.set_dispatch_collect("stripes", **stripes.get_dispatch_collect())

    def _rows(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"x": data.batch["x"], "rank": torch.full((len(data),), self.rank)})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("blocks"))
    def by_blocks(self, data: DataProto) -> DataProto:
        return self._rows(data)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("stripes"))
    def by_stripes(self, data: DataProto) -> DataProto:
        return self._rows(data)


def test_whole_pool_env_and_per_method_meshes(pool):
    group = RayWorkerGroup(pool, RayClassWithInitArgs(TwoMeshes), name_prefix="meshes")
    envs = group.execute_all_sync("env")  # two simulated nodes of two: local ranks count per node
    assert [(e["RANK"], e["LOCAL_RANK"], e["RAY_LOCAL_RANK"]) for e in envs] == [
        ("0", "0", "0"),
        ("1", "1", "1"),
        ("2", "0", "0"),
        ("3", "1", "1"),
    ]
    assert {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["RAY_LOCAL_WORLD_SIZE"], e["WG_PREFIX"]) for e in envs} == {
        ("4", "2", "2", "meshes")
    }
    data = DataProto.from_dict({"x": torch.arange(4)})
    blocks = group.by_blocks(data)  # dp = rank // 2: rows 0-1 to ranks 0, 1 and rows 2-3 to ranks 2, 3; 0 and 2 report
    assert blocks.batch["x"].tolist() == [0, 1, 2, 3] and blocks.batch["rank"].tolist() == [0, 0, 2, 2]
    stripes = group.by_stripes(data)  # dp = rank % 2: rows 0-1 to ranks 0, 2 and rows 2-3 to ranks 1, 3; 0 and 1 report
    assert stripes.batch["x"].tolist() == [0, 1, 2, 3] and stripes.batch["rank"].tolist() == [0, 0, 1, 1]
    shutdown_worker_group(group)


# ---------------------------------------------------------------------------- split pools, each its own world
class Member(Worker):
    """Joins its own group's torch.distributed world when it starts (as verl's workers do in __init__)."""

    def __init__(self, offset: int) -> None:
        super().__init__()
        self.offset = offset
        self.init_process_group(timeout_s=60)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def shift(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"v": data.batch["v"] + self.offset + self.rank})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def world(self) -> tuple[int, int, str]:
        total = torch.tensor([self.rank + self.offset])
        torch.distributed.all_reduce(total)  # over this group's ranks only
        return torch.distributed.get_world_size(), int(total), os.environ["MASTER_PORT"]


def test_halves_of_a_pool_run_side_by_side_in_their_own_worlds(pool):
    halves = split_resource_pool(pool, 2)
    groups = [RayWorkerGroup(half, RayClassWithInitArgs(Member, offset=100 * i)) for i, half in enumerate(halves)]
    data = DataProto.from_dict({"v": torch.zeros(4, dtype=torch.long)})
    assert [g.shift(data).batch["v"].tolist() for g in groups] == [[0, 0, 1, 1], [100, 100, 101, 101]]
    worlds = [g.world() for g in groups]
    assert [[(size, total) for size, total, _ in w] for w in worlds] == [[(2, 1)] * 2, [(2, 201)] * 2]
    assert len({port for w in worlds for _, _, port in w}) == 2  # one rendezvous per group
    for g in groups:
        shutdown_worker_group(g)


def test_a_split_of_a_split_gives_every_bundle_its_own_group(pool):
    first, middle, last = split_resource_pool(pool, [1, 2, 1])
    inner = split_resource_pool(middle, 1)  # bundles 1 and 2 of the pool, a pool of one each
    pieces = [first, *inner, last]
    assert [(b.pg.id, b.index) for p in pieces for b in p.bundles()] == [(b.pg.id, b.index) for b in pool.bundles()]
    groups = [RayWorkerGroup(p, RayClassWithInitArgs(Probe, tag=10 * i)) for i, p in enumerate(inner)]
    assert [g.world_size for g in groups] == [1, 1]
    data = DataProto.from_dict({"x": torch.zeros(2)})
    assert [g.add_tag(data).batch["x"].tolist() for g in groups] == [[0.0, 0.0], [10.0, 10.0]]  # rank 0 of each
    for g in groups:
        shutdown_worker_group(g)
