"""Seed 001: two worker groups on disjoint bundles, each with its own torch.distributed group."""

import torch
import torch.distributed as dist
import torch.nn as nn

from single_controller.base import Worker
from single_controller.base.decorator import Dispatch, register
from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup


class DummyAttn(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x)[0]


class NewDummyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))

    def forward(self, x):
        return self.net(x)


class DataParallelWorker(Worker):
    def __init__(self, model_cls):
        super().__init__()
        torch.manual_seed(42)  # same initial weights on every rank
        self.init_process_group()
        self.model = model_cls()

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def train_step(self, data: torch.Tensor) -> float:
        loss = self.model(data).sum()
        loss.backward()
        for p in self.model.parameters():  # average gradients over this group only
            dist.all_reduce(p.grad)
            p.grad /= self.world_size
        return loss.item()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sample_grads(self):
        name, p = next((n, p) for n, p in self.model.named_parameters() if p.requires_grad)
        return name, p.grad.clone(), dist.get_world_size()


def test_two_groups_keep_their_own_process_groups(ray_cluster):
    group_a = RayWorkerGroup(RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(DataParallelWorker, model_cls=DummyAttn))
    group_b = RayWorkerGroup(RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(DataParallelWorker, model_cls=NewDummyModel))
    # different data on each rank; both groups step at the same time
    futures_a = group_a.execute_all_async("train_step", list(torch.randn(4, 8, 16).chunk(2)))
    futures_b = group_b.execute_all_async("train_step", list(torch.randn(4, 32).chunk(2)))
    import ray

    ray.get(futures_a + futures_b)
    for group in (group_a, group_b):
        grads = group.sample_grads()
        assert all(world == 2 for _, _, world in grads)
        assert torch.allclose(grads[0][1], grads[1][1])
