"""Seed 002 (notebook): Ray tasks, nested actors, and a worker group on 2 devices with ONE_TO_ALL.

Run: python -m examples.seed_002_notebook [--device cuda]   (2 worker processes)
"""

import ray

from examples.seed_000_ray_api import GPUAccumulator, GPUAccumulatorDecorator
from single_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup


@ray.remote
def example_task(x):
    return x * x


@ray.remote
class ChildActor:
    def do_work(self):
        return "Work done by child"


@ray.remote
class ParentActor:
    def create_child(self):
        self.child_actor = ChildActor.remote()

    def get_work(self):
        return ray.get(self.child_actor.do_work.remote())


def tasks_and_nested_actors() -> tuple[list[int], str]:
    squares = ray.get([example_task.remote(i) for i in range(10)])
    parent_actor = ParentActor.remote()
    ray.get(parent_actor.create_child.remote())
    return squares, ray.get(parent_actor.get_work.remote())


def worker_groups(use_gpu: bool) -> tuple[list, list]:
    resource_pool = RayResourcePool([2], use_gpu=use_gpu)
    worker_group = RayWorkerGroup(resource_pool, RayClassWithInitArgs(cls=GPUAccumulator))
    added = worker_group.execute_all_sync("add", x=[1, 3])  # 0 + 1 => 1, 1 + 3 => 4
    gpu_accumulator_decorator = RayWorkerGroup(resource_pool, RayClassWithInitArgs(cls=GPUAccumulatorDecorator))
    return added, gpu_accumulator_decorator.add(10)  # [10, 11]


if __name__ == "__main__":
    from examples._common import parse_device

    device = parse_device(__doc__)
    ray.init(num_cpus=4)
    print(*tasks_and_nested_actors(), sep="\n")
    print(*worker_groups(use_gpu=device == "cuda"), sep="\n")
    ray.shutdown()
