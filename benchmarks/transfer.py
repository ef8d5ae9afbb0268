"""DataProto transfer through the single controller: what a round trip costs, and how many bytes a step moves.

    python -m benchmarks.transfer [--mb 256] [--workers 2] [--repeats 5]
    python -m benchmarks.transfer --per-step [--config-name demo] [--steps 2] [--set KEY=VALUE ...]

The first prints JSON: seconds per round trip (median) and the payload rate in GB/s (payload bytes moved out and
back, divided by the time). The worker echoes its chunk, so the figure is pure dispatch + transfer cost.

``--per-step`` runs training steps of the real trainer (a preset plus overrides; null model and data paths are
the built-in demo's, whose prompts are left-padded to ``data.max_prompt_length`` like any others, so a preset's
shapes are reproduced without its model) and counts the bytes of every worker-group call's ``DataProto``
arguments (driver -> workers) and results (workers -> driver): tensor bytes per call, and the pickled
non-tensor and meta-info bytes beside them. Counting is deterministic: two steps are enough.
"""

import argparse
import collections
import pickle
import statistics
import tempfile
import time
from typing import Any

import ray
import torch

from benchmarks.common import emit, machine, stdout_to_stderr
from single_controller.base.register import Dispatch, register
from single_controller.base.worker import Worker
from single_controller.data_proto import DataProto
from single_controller.ray.group import RayWorkerGroup
from single_controller.ray.placement import RayClassWithInitArgs, RayResourcePool


class EchoWorker(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: DataProto) -> DataProto:
        return data


def round_trip(args: argparse.Namespace) -> dict[str, Any]:
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
    ray.shutdown()
    return {
        "benchmark": "transfer",
        "payload_mib": nbytes / 2**20,
        "workers": args.workers,
        "round_trip_s_median": round(median, 4),
        "round_trip_s_all": [round(t, 4) for t in times],
        "payload_gb_per_s": round(2 * nbytes / median / 1e9, 3),
        "machine": machine("cpu"),
    }


def proto_bytes(value: Any) -> tuple[int, int]:
    """(tensor bytes, pickled non-tensor + meta-info bytes) of a DataProto; (0, 0) for anything else."""
    if not isinstance(value, DataProto):
        return 0, 0
    tensors = sum(t.numel() * t.element_size() for t in (value.batch or {}).values())
    other = len(pickle.dumps(value.non_tensor_batch)) if value.non_tensor_batch else 0
    return tensors, other + (len(pickle.dumps(value.meta_info)) if value.meta_info else 0)


def count_calls(trainer: Any, totals: dict[str, collections.Counter]) -> None:
    """Wrap every method of the trainer's worker-group views so that it adds its bytes to ``totals[name]``."""
    views = {id(v): v for v in (trainer.actor_rollout_wg, trainer.ref_wg, trainer.critic_wg, trainer.rm_wg) if v}
    for view in views.values():
        for name in set(dir(view)) - set(vars(view)) - set(dir(type(view))):  # the group's worker methods
            setattr(view, name, _counted(name, getattr(view, name), totals))


def _counted(name: str, method: Any, totals: dict[str, collections.Counter]) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        out = method(*args, **kwargs)
        sent = [proto_bytes(a) for a in (*args, *kwargs.values())]
        totals[name].update(calls=1, to_workers=sum(t for t, _ in sent), to_workers_other=sum(o for _, o in sent))
        tensors, other = proto_bytes(out)
        totals[name].update(to_driver=tensors, to_driver_other=other)
        return out

    return call


def per_step(args: argparse.Namespace) -> dict[str, Any]:
    from trainer.running.build import build_trainer
    from verl_compat.cli import load_config

    with tempfile.TemporaryDirectory(prefix="colorl-bench-transfer-") as local_dir:
        overrides = [
            *args.overrides,
            f"trainer.default_local_dir={local_dir}",
            "trainer.logger=[]",
            "trainer.val_before_train=false",
            "trainer.resume_mode=disable",
        ]
        with stdout_to_stderr():
            trainer = build_trainer(load_config(overrides, config_name=args.config_name))
            ray.init(num_cpus=trainer.plan.n_workers + 1, include_dashboard=False, log_to_driver=False)
            trainer.init_workers()
        totals: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        count_calls(trainer, totals)
        batches = iter(trainer.train_dataloader)
        for _ in range(args.steps):
            trainer.global_step += 1
            trainer.train_step(DataProto.from_single_dict(next(batches)))
        ray.shutdown()
    cfg = trainer.config
    calls = {name: {k: v // args.steps for k, v in counts.items()} for name, counts in sorted(totals.items())}
    return {
        "benchmark": "transfer",
        "config_name": args.config_name,
        "overrides": args.overrides,
        "steps": args.steps,
        "shapes": {
            "prompts": cfg.data.train_batch_size,
            "n": cfg.actor_rollout_ref.rollout.n,
            "prompt_length": cfg.data.max_prompt_length,
            "response_length": cfg.data.max_response_length,
            "workers": trainer.plan.n_workers,
        },
        "to_workers_bytes_per_step": sum(c["to_workers"] for c in calls.values()),
        "to_driver_bytes_per_step": sum(c["to_driver"] for c in calls.values()),
        "other_bytes_per_step": sum(c["to_workers_other"] + c["to_driver_other"] for c in calls.values()),
        "by_call": calls,
        "machine": machine(cfg.trainer.device),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=256, help="payload size in MiB")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--per-step", action="store_true", help="count the bytes of training steps instead")
    parser.add_argument("--config-name", default="demo", help="--per-step: the preset (conf/<name>.yaml)")
    parser.add_argument("--steps", type=int, default=2, help="--per-step: training steps counted")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="--per-step: a config override",
    )
    args = parser.parse_args()
    emit(per_step(args) if args.per_step else round_trip(args))


if __name__ == "__main__":
    main()
