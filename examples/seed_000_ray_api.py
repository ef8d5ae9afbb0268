"""Seed 000, chapters 1-3: Ray actors, resource pools and worker groups, dispatch and collect.

Run: python -m examples.seed_000_ray_api [--device cuda]   (8 worker processes; 8 GPUs with cuda)
"""

import ray
import torch

from single_controller import Dispatch, Execute, RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, Worker, register
from single_controller.base.dispatch import collect_all_to_all
from verl_compat.single_controller.ray.base import merge_resource_pool  # pools made from pools: the door's

DEVICE = "cpu"


@ray.remote
class Accumulator:
    def __init__(self):
        self.value = 0

    def add(self, x):
        self.value += x

    def get_value(self):
        return self.value


@ray.remote
class GPUAccumulator(Worker):
    def __init__(self) -> None:
        super().__init__()
        # The initial value of each rank is the same as the rank
        self.value = torch.zeros(size=(1,), device=self.device) + self.rank

    def add(self, x):
        self.value += x
        print(f"rank {self.rank}, value: {self.value}")
        return self.value.cpu()


@ray.remote
class GPUAccumulatorDecorator(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.value = torch.zeros(size=(1,), device=self.device) + self.rank

    # map from a single input to all the workers
    @register(Dispatch.ONE_TO_ALL)
    def add(self, x):
        self.value = self.value + x
        print(f"rank {self.rank}, value: {self.value}")
        return self.value.cpu()


def two_to_all_dispatch_fn(worker_group, *args, **kwargs):
    """Assume the input is a list of 2. Duplicate the input interleaved and pass to each worker."""
    for arg in args:
        assert len(arg) == 2
        for i in range(worker_group.world_size - 2):
            arg.append(arg[i % 2])
    for v in kwargs.values():
        assert len(v) == 2
        for i in range(worker_group.world_size - 2):
            v.append(v[i % 2])
    return args, kwargs


@ray.remote
class TestActor(Worker):
    def __init__(self, x) -> None:
        super().__init__()
        self._x = x

    def foo(self, y):
        return self._x + y

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def foo_rank_zero(self, x, y):
        return self._x + y + x

    @register(dispatch_mode={"dispatch_fn": two_to_all_dispatch_fn, "collect_fn": collect_all_to_all})
    def foo_custom(self, x, y):
        return self._x + y + x


def chapter1() -> tuple[int, int]:
    """A stateful Ray actor: returns the value before and after add(10)."""
    accumulator = Accumulator.remote()
    before = ray.get(accumulator.get_value.remote())
    accumulator.add.remote(10)
    return before, ray.get(accumulator.get_value.remote())


def chapters2_and_3(use_gpu: bool) -> dict:
    """Pools, merged pools, execute_all_sync, ONE_TO_ALL, custom dispatch and rank-zero execution."""
    out = {}
    resource_pool = RayResourcePool([4], use_gpu=use_gpu)
    class_with_args = RayClassWithInitArgs(cls=GPUAccumulator)
    worker_group = RayWorkerGroup(resource_pool, class_with_args)
    out["add_1"] = worker_group.execute_all_sync("add", x=[1, 1, 1, 1])  # [1, 2, 3, 4]

    resource_pool_1 = RayResourcePool([4], use_gpu=use_gpu, name_prefix="a")
    resource_pool_merge = merge_resource_pool(resource_pool, resource_pool_1)
    worker_group_1 = RayWorkerGroup(resource_pool_1, class_with_args)
    worker_group_merge = RayWorkerGroup(resource_pool_merge, class_with_args)
    out["add_2"] = worker_group_1.execute_all_sync("add", x=[2, 2, 2, 2])  # [2, 3, 4, 5]
    out["add_3_merged"] = worker_group_merge.execute_all_sync("add", x=[3] * 8)  # [3, ..., 10]
    out["world_sizes"] = (worker_group.world_size, worker_group_1.world_size, worker_group_merge.world_size)

    gpu_accumulator_decorator = RayWorkerGroup(resource_pool_merge, RayClassWithInitArgs(cls=GPUAccumulatorDecorator))
    out["one_to_all_10"] = gpu_accumulator_decorator.add(x=10)  # rank + 10

    worker_group = RayWorkerGroup(resource_pool, RayClassWithInitArgs(cls=TestActor, x=2))
    out["custom"] = worker_group.foo_custom(x=[1, 2], y=[5, 6])  # [8, 10, 8, 10]
    out["rank_zero"] = worker_group.foo_rank_zero(x=1, y=2)  # 5
    return out


if __name__ == "__main__":
    from examples._common import parse_device

    device = parse_device(__doc__)
    ray.init(num_cpus=16 if device == "cpu" else None)  # logical CPUs: one per worker bundle
    print("chapter 1:", chapter1())
    for key, value in chapters2_and_3(use_gpu=device == "cuda").items():
        print(f"{key}: {value}")
    ray.shutdown()
