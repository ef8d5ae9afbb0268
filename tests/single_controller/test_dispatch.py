"""The core's dispatch modes, padding, futures, async methods and fail-fast pools on a real Ray cluster (the other
modes: tests/verl_compat/test_worker_api.py)."""

import asyncio
import time

import pytest
import ray
import torch

from single_controller import (
    DataProto,
    DataProtoFuture,
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    register,
)
from single_controller.ray.placement import ResourceUnavailableError


class Echo(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def tag(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"x": data.batch["x"], "rank": torch.full((len(data),), self.rank)})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def double_async(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"x": data.batch["x"] * 2})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def slow_rank(self, delay: float) -> int:
        await asyncio.sleep(delay)
        return self.rank


@pytest.fixture(scope="module")
def group(ray_cluster):
    return RayWorkerGroup(RayResourcePool([4], use_gpu=False), RayClassWithInitArgs(Echo))


@pytest.mark.parametrize("n", range(1, 18))
def test_padding_for_any_batch_size(group, n):
    data = DataProto.from_dict({"x": torch.arange(n)})
    out = group.tag(data)
    assert out.batch["x"].tolist() == list(range(n))
    chunk = -(-n // 4)
    assert out.batch["rank"].tolist() == [i // chunk for i in range(n)]
    assert len(data) == n  # the caller's object is not changed


def test_padding_off_names_sizes(group):
    data = DataProto.from_dict({"x": torch.arange(6)}, auto_padding=False)
    with pytest.raises(ValueError, match="size 6 into 4"):
        group.tag(data)


def test_non_blocking_future_feeds_next_call(group):
    data = DataProto.from_dict({"x": torch.arange(8)})
    future = group.double_async(data)
    assert isinstance(future, DataProtoFuture)
    out = group.tag(future)  # workers resolve the refs; the driver never fetched them
    assert out.batch["x"].tolist() == [2 * i for i in range(8)]
    assert out.batch["rank"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    padded = group.double_async(DataProto.from_dict({"x": torch.arange(5)}))
    assert padded.get().batch["x"].tolist() == [0, 2, 4, 6, 8]


def test_async_methods_run(group):
    assert group.slow_rank(0.01) == [0, 1, 2, 3]


def test_unknown_dispatch_mode_is_rejected():
    with pytest.raises(ValueError, match="unknown dispatch_mode 'fast'"):
        register(dispatch_mode="fast")
    with pytest.raises(ValueError, match="dispatch_fn"):
        register(dispatch_mode={"collect_fn": lambda wg, o: o})


def test_gpu_pool_on_cpu_machine_fails_fast(ray_cluster):
    if ray.cluster_resources().get("GPU"):
        pytest.skip("this machine has GPUs")
    start = time.time()
    with pytest.raises(ResourceUnavailableError, match="GPU"):
        RayWorkerGroup(RayResourcePool([2], use_gpu=True), RayClassWithInitArgs(Echo))
    assert time.time() - start < 30


def test_pool_larger_than_cluster_fails_fast(ray_cluster):
    start = time.time()
    with pytest.raises(ResourceUnavailableError, match="needs"):
        RayResourcePool([1000], use_gpu=False).get_placement_groups()
    assert time.time() - start < 30
