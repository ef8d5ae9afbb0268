"""DataProto's tensor storage: ColoRL's TensorBatch against tensordict.TensorDict (verl's).

    python -m benchmarks.tensordict_storage [--rows 1024] [--width 1024] [--keys 4] [--chunks 8] [--repeats 15]

For one PPO-shaped batch (``--keys`` int64 tensors of ``rows x width``) it measures, for each storage:
- ``chunk_pickled_mib``: what one of ``--chunks`` chunks pickles to (what Ray copies into its object store);
- ``chunk_put_get_s``: ``ray.get(ray.put(chunk))``, the transfer a worker-group call pays per rank;
- ``chunk_s`` / ``concat_s``: splitting the batch into ``--chunks`` parts and joining them back.
Prints JSON; times are [median, best] of ``--repeats``. DataProto chunks are views; its pickling copies out their
rows only.
"""

import argparse
import pickle
import statistics
import time
from collections.abc import Callable

import ray
import torch
from tensordict import TensorDict

from benchmarks.common import emit, machine
from single_controller.data_proto import DataProto


def timed_s(fn: Callable[[], object], repeats: int) -> list[float]:
    """[median, best] seconds: on a shared machine the best is the steadier figure."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return [round(statistics.median(times), 5), round(min(times), 5)]


def measure(chunk: Callable[[], list], concat: Callable[[list], object], repeats: int) -> dict:
    parts = chunk()
    return {
        "chunk_pickled_mib": round(len(pickle.dumps(parts[0])) / 2**20, 2),
        "chunk_put_get_s": timed_s(lambda: ray.get(ray.put(parts[0])), repeats),
        "chunk_s": timed_s(chunk, repeats),
        "concat_s": timed_s(lambda: concat(parts), repeats),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--width", type=int, default=1024, help="columns of each tensor (tokens)")
    parser.add_argument("--keys", type=int, default=4)
    parser.add_argument("--chunks", type=int, default=8, help="ranks the batch is split over")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    tensors = {f"k{i}": torch.randint(0, 32000, (args.rows, args.width)) for i in range(args.keys)}
    data = DataProto.from_dict(tensors)
    td = TensorDict(tensors, batch_size=[args.rows])
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    results = {
        "TensorBatch": measure(lambda: data.chunk(args.chunks), DataProto.concat, args.repeats),
        "TensorDict": measure(lambda: td.chunk(args.chunks), lambda parts: torch.cat(parts), args.repeats),
    }
    emit(
        {
            "benchmark": "tensordict_storage",
            "batch_mib": round(sum(t.nbytes for t in tensors.values()) / 2**20, 1),
            "rows": args.rows,
            "width": args.width,
            "keys": args.keys,
            "chunks": args.chunks,
            "results": results,
            "machine": machine("cpu"),
        }
    )
    ray.shutdown()


if __name__ == "__main__":
    main()
