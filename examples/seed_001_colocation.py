"""Seed 001: two models on disjoint worker groups, and two roles colocated in one process (WorkerDict + spawn).

Run: python -m examples.seed_001_colocation [--device cuda]   (4 + 2 worker processes)
"""

import ray
import torch
import torch.distributed as dist
import torch.nn as nn

from single_controller import (
    DataProto,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    create_colocated_worker_cls,
    register,
)
from verl_compat.single_controller.base.decorator import Dispatch  # the door's enum: the seed's DP_COMPUTE too


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
    """Holds one model replica; gradients are averaged over this worker group's process group."""

    def __init__(self, model_cls):
        super().__init__()
        torch.manual_seed(42)  # same initial weights on every rank
        self.init_process_group()
        self.model = model_cls().to(self.device)

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def train_step(self, data: torch.Tensor) -> float:
        loss = self.model(data.to(self.device)).sum()
        loss.backward()
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= self.world_size
        return loss.item()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sample_grads(self):
        name, p = next((n, p) for n, p in self.model.named_parameters() if p.requires_grad)
        return name, p.grad.cpu(), dist.get_world_size()


def two_groups(use_gpu: bool) -> dict[str, list]:
    """GroupA (DummyAttn) and GroupB (NewDummyModel) train side by side on 2 workers each."""
    groups = {
        "GroupA_DummyAttn": (DummyAttn, torch.randn(4, 8, 16)),
        "GroupB_NewDummyModel": (NewDummyModel, torch.randn(4, 32)),
    }
    wgs = {
        name: RayWorkerGroup(
            RayResourcePool([2], use_gpu=use_gpu), RayClassWithInitArgs(DataParallelWorker, model_cls=cls)
        )
        for name, (cls, _) in groups.items()
    }
    futures = [wgs[name].execute_all_async("train_step", list(data.chunk(2))) for name, (_, data) in groups.items()]
    ray.get([f for fs in futures for f in fs])
    return {name: wg.sample_grads() for name, wg in wgs.items()}


@ray.remote
class Actor(Worker):
    def __init__(self) -> None:
        super().__init__()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def add(self, data: DataProto):
        data.batch["a"] = data.batch["a"].to(self.device)
        data.batch["a"] += self.rank
        return data


@ray.remote
class Critic(Worker):
    def __init__(self, config) -> None:
        super().__init__()
        self.config = config

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def sub(self, data: DataProto):
        data.batch["a"] = data.batch["a"].to(self.device)
        data.batch["a"] -= self.config["b"]
        return data


def colocated_workers(use_gpu: bool) -> tuple[DataProto, DataProto, RayWorkerGroup]:
    """Actor and critic in one WorkerDict process per device; returns both outputs and the fused group."""
    data = DataProto.from_dict({"a": torch.zeros(10)})
    actor_cls = RayClassWithInitArgs(cls=Actor)
    critic_cls = RayClassWithInitArgs(cls=Critic, config={"b": 10})
    resource_pool = RayResourcePool(process_on_nodes=[2], use_gpu=use_gpu)
    cls_dict = {"actor": actor_cls, "critic": critic_cls}
    ray_cls_with_init = create_colocated_worker_cls(cls_dict)
    wg_dict = RayWorkerGroup(resource_pool=resource_pool, ray_cls_with_init=ray_cls_with_init)
    spawn_wg = wg_dict.spawn(prefix_set=cls_dict.keys())
    actor_output = spawn_wg["actor"].add(data)  # [0]*5 + [1]*5
    critic_output = spawn_wg["critic"].sub(data)  # [-10]*10
    return actor_output, critic_output, wg_dict


if __name__ == "__main__":
    from examples._common import parse_device

    device = parse_device(__doc__)
    ray.init(num_cpus=16 if device == "cpu" else None)
    for name, grads in two_groups(use_gpu=device == "cuda").items():
        same = all(torch.allclose(grads[0][1], g[1]) for g in grads)
        print(f"{name}: gradients identical across ranks: {same}")
    actor_output, critic_output, _ = colocated_workers(use_gpu=device == "cuda")
    print(actor_output.batch["a"])
    print(critic_output.batch["a"])
    ray.shutdown()
