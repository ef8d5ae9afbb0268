"""The seed tutorials' code (../shared/seeds), with only the `verl.` prefix dropped and cuda -> cpu."""

import ray
import torch

from single_controller import DataProto
from single_controller.base import Worker
from single_controller.base.decorator import Dispatch, Execute, collect_all_to_all, register
from single_controller.ray.base import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
    merge_resource_pool,
)


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
        self.value = torch.zeros(size=(1,), device="cpu") + self.rank

    def add(self, x):
        self.value += x
        return self.value.cpu()


@ray.remote
class GPUAccumulatorDecorator(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.value = torch.zeros(size=(1,), device="cpu") + self.rank

    @register(Dispatch.ONE_TO_ALL)
    def add(self, x):
        self.value = self.value + x
        return self.value.cpu()


def two_to_all_dispatch_fn(worker_group, *args, **kwargs):
    """Assume the input is a list of 2. Duplicate the input interleaved and pass to each worker."""
    for arg in args:
        assert len(arg) == 2
        for i in range(worker_group.world_size - 2):
            arg.append(arg[i % 2])
    for k, v in kwargs.items():
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


@ray.remote
class Actor(Worker):
    def __init__(self) -> None:
        super().__init__()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def add(self, data: DataProto):
        data.batch["a"] = data.batch["a"].to("cpu")
        data.batch["a"] += self.rank
        return data


@ray.remote
class Critic(Worker):
    def __init__(self, config) -> None:
        super().__init__()
        self.config = config

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def sub(self, data: DataProto):
        data.batch["a"] = data.batch["a"].to("cpu")
        data.batch["a"] -= self.config["b"]
        return data


def test_chapter1_ray_actor(ray_cluster):
    accumulator = Accumulator.remote()
    assert ray.get(accumulator.get_value.remote()) == 0
    accumulator.add.remote(10)
    assert ray.get(accumulator.get_value.remote()) == 10


def test_chapters2_and_3_pools_groups_and_dispatch(ray_cluster):
    resource_pool = RayResourcePool([4], use_gpu=False)
    class_with_args = RayClassWithInitArgs(cls=GPUAccumulator)
    worker_group = RayWorkerGroup(resource_pool, class_with_args)
    assert [t.item() for t in worker_group.execute_all_sync("add", x=[1, 1, 1, 1])] == [1, 2, 3, 4]

    resource_pool_1 = RayResourcePool([4], use_gpu=False, name_prefix="a")
    resource_pool_merge = merge_resource_pool(resource_pool, resource_pool_1)
    worker_group_1 = RayWorkerGroup(resource_pool_1, class_with_args)
    worker_group_merge = RayWorkerGroup(resource_pool_merge, class_with_args)
    assert [t.item() for t in worker_group_1.execute_all_sync("add", x=[2, 2, 2, 2])] == [2, 3, 4, 5]
    assert [t.item() for t in worker_group_merge.execute_all_sync("add", x=[3] * 8)] == [3, 4, 5, 6, 7, 8, 9, 10]
    assert (worker_group.world_size, worker_group_1.world_size, worker_group_merge.world_size) == (4, 4, 8)

    gpu_accumulator_decorator = RayWorkerGroup(resource_pool_merge, RayClassWithInitArgs(cls=GPUAccumulatorDecorator))
    assert [t.item() for t in gpu_accumulator_decorator.add(x=10)] == [10 + r for r in range(8)]

    worker_group = RayWorkerGroup(resource_pool, RayClassWithInitArgs(cls=TestActor, x=2))
    assert worker_group.foo_custom(x=[1, 2], y=[5, 6]) == [8, 10, 8, 10]
    assert worker_group.foo_rank_zero(x=1, y=2) == 5
    assert worker_group.execute_all_sync("foo", y=1) == [3, 3, 3, 3]  # unregistered methods still run


def test_seed_002_two_worker_group(ray_cluster):
    resource_pool = RayResourcePool([2], use_gpu=False)
    worker_group = RayWorkerGroup(resource_pool, RayClassWithInitArgs(cls=GPUAccumulator))
    assert len(worker_group.workers) == 2
    assert [t.item() for t in worker_group.execute_all_sync("add", x=[1, 3])] == [1, 4]
    decorated = RayWorkerGroup(resource_pool, RayClassWithInitArgs(cls=GPUAccumulatorDecorator))
    assert [t.item() for t in decorated.add(10)] == [10, 11]


def test_seed_001_colocated_workers(ray_cluster):
    data = DataProto.from_dict({"a": torch.zeros(10)})
    actor_cls = RayClassWithInitArgs(cls=Actor)
    critic_cls = RayClassWithInitArgs(cls=Critic, config={"b": 10})
    resource_pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    cls_dict = {"actor": actor_cls, "critic": critic_cls}
    ray_cls_with_init = create_colocated_worker_cls(cls_dict)
    wg_dict = RayWorkerGroup(resource_pool=resource_pool, ray_cls_with_init=ray_cls_with_init)
    spawn_wg = wg_dict.spawn(prefix_set=cls_dict.keys())
    colocated_actor_wg = spawn_wg["actor"]
    colocated_critic_wg = spawn_wg["critic"]
    actor_output = colocated_actor_wg.add(data)
    critic_output = colocated_critic_wg.sub(data)
    assert actor_output.batch["a"].tolist() == [0] * 5 + [1] * 5
    assert critic_output.batch["a"].tolist() == [-10] * 10
    assert data.batch["a"].tolist() == [0] * 10  # the caller's batch is untouched
    # one process per device holds both roles
    pids = {info["pid"] for info in wg_dict.execute_all_sync("whoami")}
    assert len(pids) == 2
    assert not hasattr(colocated_actor_wg, "sub") and not hasattr(colocated_critic_wg, "add")
