"""A worker group on a local Ray cluster whose object store and spill disk are a small tmpfs (run as a script).

    python tests/reliability/object_store_probe.py DIR

Ray's object store gets its minimum (80 MiB), backed by DIR, where it also spills; DIR is a tmpfs of 100 MiB.
A rank returns a result bigger than that (the worker cannot store it), then the driver sends an argument bigger
than that (the driver cannot). Prints one JSON line: what ``trainer.running.faults.named`` made of each failure.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import ray  # noqa: E402

from single_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup  # noqa: E402
from single_controller.base.register import Dispatch, register  # noqa: E402
from single_controller.base.worker import Worker  # noqa: E402
from single_controller.ray.health import shutdown_worker_group  # noqa: E402
from trainer.running.faults import named  # noqa: E402

BIG = 150 * 2**20


class Hoarder(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def generate_sequences(self, payload=None) -> np.ndarray:
        return np.ones(BIG if self.rank == 1 and payload is None else 1, dtype=np.uint8)


def failure(call) -> str:
    try:
        call()
    except ray.exceptions.RayError as exc:
        return str(named(exc))
    return "no failure"


def main(store_dir: str) -> None:
    ray.init(
        num_cpus=2,
        object_store_memory=80 * 2**20,
        include_dashboard=False,
        log_to_driver=False,
        _plasma_directory=store_dir,
        object_spilling_directory=store_dir,
    )
    group = RayWorkerGroup(RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(Hoarder))
    worker = failure(group.generate_sequences)
    driver = failure(lambda: group.generate_sequences(np.ones(BIG, dtype=np.uint8)))
    shutdown_worker_group(group)
    print(json.dumps({"worker": worker, "driver": driver, "rank1": group.processes[1]}))


if __name__ == "__main__":
    main(sys.argv[1])
