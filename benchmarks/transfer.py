"""DataProto transfer through the single controller: driver -> workers -> driver round trip.

    python -m benchmarks.transfer [--mb 256] [--workers 2] [--repeats 5]

Prints JSON: seconds per round trip (median) and the payload rate in GB/s (payload bytes moved out and
back, divided by the time). The worker echoes its chunk, so the figure is pure dispatch + transfer cost.
"""

import argparse
import statistics
import time

import ray
import torch

from benchmarks.common import emit, machine
from single_controller import DataProto
from single_controller.base import Worker
from single_controller.base.decorator import Dispatch, register
from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup


class EchoWorker(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: DataProto) -> DataProto:
        return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=256, help="payload size in MiB")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    ray.init(num_cpus=args.workers + 1, include_dashboard=False, log_to_driver=False)
    group = RayWorkerGroup(RayResourcePool([args.workers], use_gpu=False), RayClassWithInitArgs(EchoWorker))
    rows = 1024 * args.workers
    data = DataProto.from_dict({"x": torch.randn(rows, args.mb * 2**20 // 4 // rows)})
    nbytes = data.batch["x"].numel() * 4
    group.echo(data[: args.workers])  # warm-up: worker imports, first-call costs
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        out = group.echo(data)
        times.append(time.perf_counter() - start)
    assert torch.equal(out.batch["x"], data.batch["x"])
    median = statistics.median(times)
    emit({
        "benchmark": "transfer", "payload_mib": nbytes / 2**20, "workers": args.workers,
        "round_trip_s_median": round(median, 4), "round_trip_s_all": [round(t, 4) for t in times],
        "payload_gb_per_s": round(2 * nbytes / median / 1e9, 3), "machine": machine("cpu"),
    })
    ray.shutdown()


if __name__ == "__main__":
    main()
