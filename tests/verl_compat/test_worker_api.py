"""verl's worker-group API on ColoRL, on CPU: the signatures and behaviour verl's own single-controller tests use.

Worker-group constructor keywords (name_prefix, device_name, detached, worker_names/worker_handles), attaching
to running workers by name, execute_all_async, non-blocking calls, DataProtoFuture.get, DataProtoConfig.auto_padding,
the n-d dispatch helper, nested workers, torch.distributed's default init in workers, colocated async methods,
and DataProto built from / handing out tensordict.TensorDict.
"""

import asyncio
import pickle

import numpy as np
import pytest
import ray
import torch
import torch.distributed as dist
from tensordict import TensorDict

from verl_compat.single_controller import DataProto, DataProtoConfig, DataProtoFuture
from verl_compat.single_controller.base import Worker
from verl_compat.single_controller.base.decorator import (
    Dispatch,
    Execute,
    collect_all_to_all,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)
from verl_compat.single_controller.ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
)


def first_two_to_all(worker_group, *args, **kwargs):
    """A custom dispatch: two values, repeated over the ranks (a, b, a, b, ...)."""
    spread = lambda v: [v[i % 2] for i in range(worker_group.world_size)]  # noqa: E731
    return tuple(spread(a) for a in args), {k: spread(v) for k, v in kwargs.items()}


class Inner(Worker):
    def __init__(self, x: int) -> None:
        super().__init__()
        self.x = x

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def get(self) -> int:
        return self.x + self.rank


class VerlStyle(Worker):
    def __init__(self, x: int) -> None:
        super().__init__()
        self.x = x
        self.inner = Inner(x=x)  # a nested worker: a plain Worker object inside the Ray actor
        self._register_dispatch_collect_info("dp", dp_rank=self.rank, is_collect=True)
        # a dp=1 x tp=2 layout: both ranks get all rows, rank 0 reports
        self._register_dispatch_collect_info("tp", dp_rank=0, is_collect=self.rank == 0)

    def foo(self, y):
        return self.x + y

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def foo_rank_zero(self, x, y):
        return self.x + x + y

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def foo_one_to_all(self, x, y):
        return self.x + x + y

    @register(Dispatch.ALL_TO_ALL, blocking=False)
    def foo_all_to_all(self, x, y):
        return self.x + x + y

    @register(dispatch_mode={"dispatch_fn": first_two_to_all, "collect_fn": collect_all_to_all})
    def foo_custom(self, x, y):
        return self.x + x + y

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def plus(self, x):
        return x + self.rank

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def count(self, data: DataProto) -> int:
        return len(data)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def apply(self, func, data: DataProto) -> DataProto:
        return func(self, data)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def nested_get(self) -> int:
        return self.inner.get()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def add_rank(self, data: DataProto) -> DataProto:
        data.batch["a"] += self.rank
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    async def double_later(self, data: DataProto) -> DataProto:
        await asyncio.sleep(0.01)
        data.batch["out"] = data.batch["a"] * 2 + self.rank
        return data

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("dp"))
    def nd_add(self, data):
        bump = 10 * (self.rank + 1)
        if isinstance(data, TensorDict):
            data["a"] = data["a"] + bump
            return data
        return DataProto.from_dict({"a": data.batch["a"] + bump})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("dp"))
    def nd_lengths(self, data: TensorDict) -> TensorDict:
        lengths = torch.tensor([row.shape[0] for row in data["ids"].unbind(0)])
        return TensorDict({"len": lengths, "rank": torch.full((len(data),), self.rank)}, batch_size=[len(data)])

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("tp"), blocking=False)
    def tp_rows(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(
            {"rows": torch.full((len(data),), len(data)), "rank": torch.full((len(data),), self.rank)}
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_gather_ranks(self) -> torch.Tensor:
        if not dist.is_initialized():
            dist.init_process_group()  # verl workers use the env:// defaults the group sets
        out = torch.zeros(2 * self.world_size, dtype=torch.int64)
        dist.all_gather_into_tensor(out, torch.full((2,), self.rank, dtype=torch.int64))
        return out


def aux_metrics(worker, data: DataProto) -> DataProto:
    ids = data.batch["sequence_ids"]
    return DataProto(batch=TensorDict({"ids": ids, "count": ids.sum(-1)}, batch_size=ids.shape[0]))


def plus_one(t: torch.Tensor) -> torch.Tensor:
    return t + 1


@pytest.fixture(scope="module")
def pool(ray_cluster):
    return RayResourcePool([2], use_gpu=False)


@pytest.fixture(scope="module")
def group(pool):
    """Detached workers outlive the driver's handles, so the module kills them itself."""
    group = RayWorkerGroup(
        pool, RayClassWithInitArgs(VerlStyle, x=2), name_prefix="verl_api", device_name="cpu", detached=True
    )
    yield group
    for worker in group.workers:
        ray.kill(worker, no_restart=True)


@pytest.fixture
def padding_switch():
    yield DataProtoConfig
    DataProtoConfig.auto_padding = None  # back to the environment's default


# ---------------------------------------------------------------------------- worker group
def test_named_workers_and_execute(group):
    assert group.worker_names == ["verl_api_VerlStyle_0", "verl_api_VerlStyle_1"]
    assert ray.get(ray.get_actor(group.worker_names[1]).foo.remote(1)) == 3
    assert group.execute_all_sync("foo", y=3) == [5, 5]
    refs = group.execute_all_async("foo", y=4)
    assert all(isinstance(r, ray.ObjectRef) for r in refs) and ray.get(refs) == [6, 6]
    torch.testing.assert_close(group.execute_func_rank_zero(plus_one, torch.ones(2, 2)), torch.full((2, 2), 2.0))


def test_non_blocking_and_custom_dispatch(group):
    assert ray.get(group.foo_one_to_all(x=1, y=2)) == [5, 5]
    assert ray.get(group.foo_all_to_all(x=[1, 2], y=[5, 6])) == [8, 10]
    assert group.foo_custom(x=[1, 2], y=[5, 6]) == [8, 10]
    assert group.foo_rank_zero(x=1, y=2) == 5


@ray.remote(num_cpus=0)
def drive_attached(worker_names: list[str]) -> tuple:
    attached = RayWorkerGroup.from_detached(
        worker_names=worker_names, ray_cls_with_init=RayClassWithInitArgs(VerlStyle, x=2)
    )
    return attached.worker_names, attached.foo_custom(x=[1, 2], y=[5, 6]), attached.foo_rank_zero(x=1, y=2)


def test_attach_by_name_from_another_process(group):
    names, custom, rank_zero = ray.get(drive_attached.remote(group.worker_names))
    assert names == group.worker_names and custom == [8, 10] and rank_zero == 5
    assert [ray.get_actor(name) for name in group.worker_names] == group.workers
    by_handle = RayWorkerGroup(ray_cls_with_init=RayClassWithInitArgs(VerlStyle, x=2), worker_handles=group.workers)
    assert by_handle.nested_get() == [2, 3]


def test_nested_worker(group):
    assert group.nested_get() == [2, 3]


def test_torch_distributed_default_init(group):
    for out in group.all_gather_ranks():
        assert out.tolist() == [0, 0, 1, 1]


def test_constructor_errors(pool, group):
    with pytest.raises(ValueError, match="device_name='npu'"):
        RayWorkerGroup(pool, RayClassWithInitArgs(VerlStyle, x=2), device_name="npu")
    with pytest.raises(ValueError, match="use_gpu=True"):
        RayWorkerGroup(pool, RayClassWithInitArgs(VerlStyle, x=2), device_name="cuda")
    with pytest.raises(ValueError, match="verl_api_VerlStyle_0.*another name_prefix"):
        RayWorkerGroup(pool, RayClassWithInitArgs(VerlStyle, x=2), name_prefix="verl_api")
    with pytest.raises(ValueError, match="resource_pool"):
        RayWorkerGroup(ray_cls_with_init=RayClassWithInitArgs(VerlStyle, x=2))


def test_driver_function_on_every_rank(group):
    data = DataProto(
        TensorDict({"sequence_ids": torch.arange(24).view(8, 3)}, batch_size=8), meta_info={"query_length": 3}
    )
    out = group.execute_with_func_generator(aux_metrics, data)
    torch.testing.assert_close(out.batch["count"], aux_metrics(None, data).batch["count"])


def test_dp_compute_lists_and_errors(group):
    assert group.plus([10, 10]) == [10, 11]
    with pytest.raises(ValueError, match="list of length world_size=2"):
        group.plus([1, 2, 3])
    assert group.count(DataProto.from_dict({"x": torch.arange(8)})) == [4, 4]


def test_with_func(group):
    def add_rank(worker, data):
        return DataProto.from_dict({"x": data.batch["x"] + worker.rank})

    assert group.apply(add_rank, DataProto.from_dict({"x": torch.zeros(2)})).batch["x"].tolist() == [0, 1]
    assert group.execute_func_rank_zero(lambda a: a + 1, 41) == 42


# ---------------------------------------------------------------------------- DataProto dispatch
def test_dp_compute_with_tensordict_batch(group):
    data = DataProto(batch=TensorDict({"a": torch.arange(4.0)}, batch_size=[4]))
    out = group.add_rank(data)
    assert "a" in out.batch.keys() and len(out) == 4
    torch.testing.assert_close(out.batch["a"], torch.tensor([0.0, 1.0, 3.0, 4.0]))
    torch.testing.assert_close(data.batch["a"], torch.arange(4.0))  # the caller's batch is untouched


def test_async_method_returns_future(group):
    future = group.double_later(DataProto.from_dict({"a": torch.arange(4.0)}))
    assert isinstance(future, DataProtoFuture)
    out = future.get()
    torch.testing.assert_close(out.batch["out"], torch.tensor([0.0, 2.0, 5.0, 7.0]))


def test_nd_dispatch_over_dp_ranks(group):
    out = group.nd_add(TensorDict({"a": torch.zeros(4)}, batch_size=[4]))
    assert isinstance(out, TensorDict)
    torch.testing.assert_close(out["a"], torch.tensor([10.0, 10.0, 20.0, 20.0]))
    padded = group.nd_add(DataProto.from_dict({"a": torch.zeros(3)}))
    torch.testing.assert_close(padded.batch["a"], torch.tensor([10.0, 10.0, 20.0]))


def test_nd_dispatch_of_jagged_tensors(group):
    ids = torch.nested.as_nested_tensor([torch.arange(n) for n in (2, 3, 4, 5)], layout=torch.jagged)
    out = group.nd_lengths(TensorDict({"ids": ids}, batch_size=[4]))
    assert out["len"].tolist() == [2, 3, 4, 5] and out["rank"].tolist() == [0, 0, 1, 1]


def test_nd_dispatch_collects_from_marked_ranks(group):
    future = group.tp_rows(DataProto.from_dict({"a": torch.zeros(3)}))
    out = future.get()  # dp_size 1: both ranks see all 3 rows, only rank 0 reports
    assert out.batch["rows"].tolist() == [3, 3, 3] and out.batch["rank"].tolist() == [0, 0, 0]


def test_auto_padding_switch(group, padding_switch):
    for size in (1, 3, 5):
        na = np.array([str(i) for i in range(size)], dtype=object)
        assert len(group.add_rank(DataProto.from_dict({"a": torch.zeros(size)}, {"na": na}))) == size
        assert len(group.add_rank(data=DataProto.from_single_dict({"a": torch.zeros(size), "na": na}))) == size
    padding_switch.auto_padding = False
    with pytest.raises(ValueError, match="size 3"):
        group.add_rank(DataProto.from_dict({"a": torch.zeros(3)}))
    assert len(group.add_rank(DataProto.from_dict({"a": torch.zeros(3)}, auto_padding=True))) == 3
    assert len(group.add_rank(data=DataProto.from_single_dict({"a": torch.zeros(3)}, auto_padding=True))) == 3
    assert len(group.add_rank(DataProto.from_dict({"a": torch.zeros(4)}))) == 4


class Actor(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def add(self, data: DataProto) -> DataProto:
        data.batch["a"] += self.rank
        return data


class Critic(Worker):
    def __init__(self, config: dict) -> None:
        super().__init__()
        self.config = config

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    async def sub(self, data: DataProto) -> DataProto:
        data.batch["a"] -= self.config["b"]
        return data


def test_colocated_roles_with_device_name(pool):
    roles = {"actor": RayClassWithInitArgs(Actor), "critic": RayClassWithInitArgs(Critic, config={"b": 10})}
    fused = RayWorkerGroup(pool, create_colocated_worker_cls(roles), device_name="cpu").spawn(prefix_set=roles.keys())
    data = DataProto.from_dict({"a": torch.zeros(10)})
    expected_actor = TensorDict({"a": torch.tensor([0.0] * 5 + [1.0] * 5)}, batch_size=[10])
    torch.testing.assert_close(dict(fused["actor"].add(data).batch), dict(expected_actor.items()), atol=0, rtol=0)
    torch.testing.assert_close(fused["critic"].sub(data).batch, {"a": torch.full((10,), -10.0)}, atol=0, rtol=0)


# ---------------------------------------------------------------------------- DataProto and TensorDict
def test_batch_offers_tensordict_operations():
    td = TensorDict({"a": torch.arange(6.0), "b": torch.arange(12).view(6, 2)}, batch_size=[6])
    data = DataProto(td)
    batch = data.batch
    assert batch.batch_size == torch.Size([6]) and sorted(batch.keys()) == ["a", "b"]
    assert list(batch.select("b").keys()) == ["b"] and list(batch.exclude("b").keys()) == ["a"]
    assert batch.to("cpu")["a"].device.type == "cpu"
    torch.testing.assert_close(batch[1:3]["b"], td[1:3]["b"])
    assert batch[1]["a"].tolist() == [1.0] and batch[-1]["a"].tolist() == [5.0]  # an int keeps the batch dim
    with pytest.raises(IndexError, match="row 6 out of range"):
        batch[6]
    torch.testing.assert_close(batch[torch.tensor([0, 5])]["a"], td[torch.tensor([0, 5])]["a"])
    torch.testing.assert_close(torch.cat([batch, batch])["a"], torch.cat([td, td])["a"])
    back = batch.to_tensordict()
    assert isinstance(back, TensorDict) and back.batch_size == td.batch_size
    joined = DataProto.concat([data, DataProto(td.clone())])
    assert len(joined) == 12 and joined.batch["b"].shape == (12, 2)


def test_tensordict_errors_name_the_problem():
    with pytest.raises(ValueError, match="one batch dimension"):
        DataProto(TensorDict({"a": torch.zeros(2, 3)}, batch_size=[2, 3]))
    with pytest.raises(TypeError, match="nested"):
        DataProto(TensorDict({"n": TensorDict({"a": torch.zeros(2)}, batch_size=[2])}, batch_size=[2]))


def test_chunk_pickles_only_its_rows():
    data = DataProto(TensorDict({"x": torch.randn(64, 256)}, batch_size=[64]))
    whole, part = len(pickle.dumps(data)), len(pickle.dumps(data.chunk(8)[0]))
    assert part < whole / 6


@pytest.mark.parametrize("size", range(4, 12))
def test_padding_in_place_then_even_chunks(size):
    data = DataProto.from_dict({"a": torch.arange(size)}, {"na": np.arange(size).astype(object)})
    data.padding((-size) % 4)
    assert len(data) % 4 == 0 and {len(c) for c in data.chunk(4)} == {-(-size // 4)}
    assert data.batch["a"][size:].tolist() == [size - 1] * ((-size) % 4)


def test_padding_first_row():
    data = DataProto.from_dict({"a": torch.arange(3)})
    data.padding(2, padding_candidate="first")
    assert data.batch["a"].tolist() == [0, 1, 2, 0, 0]
    with pytest.raises(ValueError, match="'middle'"):
        data.padding(1, padding_candidate="middle")
