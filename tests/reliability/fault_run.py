"""``main.py`` with a fault injected into one worker, for the fault tests (run as a script, in its own process).

    python tests/reliability/fault_run.py kill|hang|oom|kill-rollout RANK CALL [key=value ...]

In the first worker group only (a restarted group is healthy), rank RANK's ``update_actor`` SIGKILLs its own
process, hangs, or raises CUDA's out-of-memory error, on its CALL-th call; ``kill-rollout``: the rollout group's
(``trainer.v1.trainer_mode=separate_async``) ``generate_sequences`` SIGKILLs its process. Everything else is the
ordinary ``python main.py key=value ...``.
"""

import os
import runpy
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import ray  # noqa: E402

from trainer.running.ppo_trainer import RayPPOTrainer  # noqa: E402


def arm(actor, fault: str, on_call: int) -> None:
    """Runs inside the worker (this module is __main__, so Ray ships the function by value)."""
    role = actor.worker_dict["actor_rollout"]
    original, calls = role.update_actor, [0]

    def update_actor(data):
        calls[0] += 1
        if calls[0] == on_call:
            if fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if fault == "oom":
                import torch

                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
            while True:  # fault == "hang"
                time.sleep(1)
        return original(data)

    role.update_actor = update_actor


def arm_rollout(worker, on_call: int) -> None:
    """Runs inside a rollout group's worker: its generation SIGKILLs the process on its ``on_call``-th call (Ray
    calls an actor's methods through its class, so the patch is on the sampler each generation asks for)."""
    original, calls = worker._sampler, [0]

    def sampler():
        calls[0] += 1
        if calls[0] == on_call:
            os.kill(os.getpid(), signal.SIGKILL)
        return original()

    worker._sampler = sampler


def run(fault: str, rank: int, on_call: int, overrides: list[str]) -> None:
    init_workers, armed = RayPPOTrainer.init_workers, []

    def init_workers_with_fault(self: RayPPOTrainer) -> None:
        init_workers(self)
        if not armed and fault == "kill-rollout":
            ray.get(self.ahead.rollout_group.workers[rank].__ray_call__.remote(arm_rollout, on_call))
            armed.append(rank)
        elif not armed:
            ray.get(self.fused_wg.workers[rank].__ray_call__.remote(arm, fault, on_call))
            armed.append(rank)

    RayPPOTrainer.init_workers = init_workers_with_fault
    sys.argv = [str(REPO / "main.py"), *overrides]
    runpy.run_path(sys.argv[0], run_name="__main__")  # as `python main.py`: Hydra finds conf/ beside it


if __name__ == "__main__":
    run(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
