"""A two-rank worker group on a running Ray cluster: where each rank runs and whom it met (run as a script).

    python tests/reliability/multinode_probe.py ADDRESS N_NODES

Waits until the cluster at ADDRESS has N_NODES alive nodes, starts one ``Probe`` per node through the same
``RayResourcePool`` / ``RayWorkerGroup`` as the trainer (``process_on_nodes=[1] * N_NODES``), lets the ranks
form their gloo world and all-reduce, and prints one JSON line: the nodes, then what each rank saw.
"""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import ray  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from single_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup  # noqa: E402
from single_controller.base.register import Dispatch, register  # noqa: E402
from single_controller.base.worker import Worker  # noqa: E402


class Probe(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rendezvous(self) -> dict:
        """Join the world at MASTER_ADDR:MASTER_PORT and sum ``rank + 1`` over every rank."""
        self.init_process_group(timeout_s=60)
        total = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(total)
        return {
            "rank": self.rank,
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "master_addr": os.environ["MASTER_ADDR"],
            "backend": dist.get_backend(),
            "sum": total.item(),
        }


def main(address: str, n_nodes: int) -> None:
    ray.init(address=address, log_to_driver=False)
    deadline = time.monotonic() + 60
    while len(nodes := [n for n in ray.nodes() if n["Alive"]]) < n_nodes:
        assert time.monotonic() < deadline, f"only {len(nodes)} of {n_nodes} nodes joined"
        time.sleep(0.5)
    pool = RayResourcePool([1] * n_nodes, use_gpu=False, max_colocate_count=1, placement_timeout_s=30)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(Probe))
    ranks = group.rendezvous()
    print(json.dumps({"nodes": {n["NodeID"]: n["NodeManagerAddress"] for n in nodes}, "ranks": ranks}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
