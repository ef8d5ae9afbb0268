"""LocalWorkerGroup: a worker of the driver's own process behind the same group interface as Ray's."""

import os

import torch

from single_controller.base.register import Dispatch, register
from single_controller.base.worker import Worker
from single_controller.base.worker_group import ClassWithInitArgs
from single_controller.data_proto import DataProto
from single_controller.local import LocalWorkerGroup, local_colocated_cls

CALLS: list[dict] = []


def record(*args, **kwargs) -> None:
    """A ``PYTHONBREAKPOINT`` hook: notes where ``breakpoint()`` was reached instead of opening pdb."""
    CALLS.append({"pid": os.getpid()})


class Doubler(Worker):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        breakpoint()  # the test's hook stands in for pdb
        return DataProto.from_dict({"y": data.batch["x"] * self.scale})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def draw(self) -> float:
        return torch.rand(()).item()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)


def test_a_breakpoint_in_a_worker_method_is_reached_in_the_drivers_process(monkeypatch):
    monkeypatch.setenv("PYTHONBREAKPOINT", f"{__name__}.record")
    CALLS.clear()
    group = LocalWorkerGroup(ClassWithInitArgs(Doubler, 2.0))
    out = group.double(DataProto.from_dict({"x": torch.arange(3.0)}))
    assert torch.equal(out.batch["y"], torch.tensor([0.0, 2.0, 4.0]))
    assert CALLS == [{"pid": os.getpid()}]
    assert group.world_size == 1 and group.workers[0].rank == 0


def test_role_views_of_a_colocated_group_call_their_roles_worker(monkeypatch):
    monkeypatch.setenv("PYTHONBREAKPOINT", "0")  # breakpoint() does nothing
    group = LocalWorkerGroup(local_colocated_cls({"a": ClassWithInitArgs(Doubler, 3.0)}))
    view = group.spawn(["a"])["a"]
    assert torch.equal(view.double(DataProto.from_dict({"x": torch.ones(2)})).batch["y"], torch.full((2,), 3.0))


def test_the_worker_keeps_its_own_random_state():
    """The driver's draws between two worker calls do not move the worker's generator (a process of its own)."""
    group = LocalWorkerGroup(ClassWithInitArgs(Doubler, 1.0))
    group.seed(7)
    first = group.draw()
    group.seed(7)
    torch.rand(5)  # the driver's draw, e.g. a data loader's seed
    assert group.draw() == first
