"""Seed 000, chapter 4: a tensor-parallel LLaMA MLP behind a worker group (NVMegatronRayWorkerGroup).

Run: python -m examples.seed_000_ch4_tensor_parallel [--device cuda]   (4 worker processes, tp=4; 4 GPUs with cuda)

The seed runs Megatron-LM's parallel state and a ParallelLlamaMLP on top of it; here the layer of the same name
(verl_compat.models.llama.megatron.layers) does the same with PyTorch's own tensor parallelism (DeviceMesh +
parallelize_module) on gloo or nccl. With cuda the layer has the seed's sizes; on CPU it is small. The driver
passes a list of dp_size inputs and gets one output per dp rank back: which ranks hold which shard stays inside
the workers.
"""

import ray
import torch
from omegaconf import OmegaConf

from single_controller import RayClassWithInitArgs, RayResourcePool, register
from verl_compat.models.llama.megatron.layers import LlamaMLP, ParallelLlamaMLP, local_shards, merge_tp_shards
from verl_compat.single_controller.base.decorator import Dispatch  # the door's enum: MEGATRON_COMPUTE
from verl_compat.single_controller.base.megatron.worker import MegatronWorker
from verl_compat.single_controller.ray.megatron import NVMegatronRayWorkerGroup
from verl_compat.utils.megatron_utils import init_model_parallel_config

SEED_SIZES = {"hidden_size": 4096, "ffn_hidden_size": 11008, "batch_size": 16, "seq_len": 2048}
CPU_SIZES = {"hidden_size": 64, "ffn_hidden_size": 172, "batch_size": 2, "seq_len": 8}


@ray.remote
class MLPLayerWorker(MegatronWorker):
    def __init__(self) -> None:
        super().__init__()
        if self.device.type == "cpu":
            torch.set_num_threads(1)  # four processes share the machine's cores
        # As in the seed, user code joins the process group itself (Worker already set the CUDA
        # device); init_model_parallel then only builds the (pp, dp, tp) mesh: mpu.initialize_model_parallel.
        torch.distributed.init_process_group(backend="nccl" if self.device.type == "cuda" else "gloo")
        self.init_model_parallel(tensor_model_parallel_size=4, pipeline_model_parallel_size=1)
        torch.manual_seed(10)

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, config) -> None:
        sizes = self.get_megatron_global_info()  # the seed asks Megatron's mpu for these
        megatron_config = OmegaConf.create(
            {
                "sequence_parallel": False,
                "param_dtype": "fp32",
                "tensor_model_parallel_size": sizes.tp_size,
                "pipeline_model_parallel_size": sizes.pp_size,
            }
        )
        megatron_config = init_model_parallel_config(megatron_config)
        self.parallel_layer = ParallelLlamaMLP(config=config, megatron_config=megatron_config)

    @register(Dispatch.ONE_TO_ALL)
    def get_weights(self) -> dict[str, torch.Tensor]:
        return local_shards(self.parallel_layer)

    @register(Dispatch.MEGATRON_COMPUTE)
    @torch.no_grad()
    def run_layer(self, x: torch.Tensor) -> torch.Tensor:
        return self.parallel_layer(x.to(self.device)).cpu()


def chapter4(use_gpu: bool, sizes: dict = CPU_SIZES) -> dict:
    """Build the tp=4 group, run the layer on one (seq, batch, hidden) input; return inputs and results."""
    resource_pool = RayResourcePool([4], use_gpu=use_gpu, max_colocate_count=1)
    layer_cls = RayClassWithInitArgs(cls=MLPLayerWorker)
    layer_worker_group = NVMegatronRayWorkerGroup(resource_pool=resource_pool, ray_cls_with_init=layer_cls)
    config = OmegaConf.create(
        {
            "hidden_size": sizes["hidden_size"],
            "intermediate_size": sizes["ffn_hidden_size"],
            "hidden_act": "silu",
            "pretraining_tp": 1,
            "tp": layer_worker_group.tp_size,
        }
    )
    x = torch.rand(size=(sizes["seq_len"], sizes["batch_size"], sizes["hidden_size"]), dtype=torch.float32)
    layer_worker_group.init_model(config)
    # A list of size dp (here 1): the driver speaks data parallelism only.
    output = layer_worker_group.run_layer([x])
    return {
        "sizes": (
            layer_worker_group.world_size,
            layer_worker_group.tp_size,
            layer_worker_group.pp_size,
            layer_worker_group.dp_size,
        ),
        "x": x,
        "output": output,
        "weights": layer_worker_group.get_weights(),
    }


def unsharded_output(tp_shards: list[dict[str, torch.Tensor]], x: torch.Tensor, device: str = "cpu") -> torch.Tensor:
    """The whole (unsharded) MLP, rebuilt from one tp group's shards, applied to ``x`` on ``device``."""
    state = merge_tp_shards(tp_shards)
    hidden_size, intermediate_size = state["down_proj.weight"].shape
    with torch.device(device):
        mlp = LlamaMLP(hidden_size, intermediate_size)
    mlp.load_state_dict(state)
    with torch.no_grad():
        return mlp(x.to(device)).cpu()


if __name__ == "__main__":
    from examples._common import parse_device

    device = parse_device(__doc__)
    ray.init(num_cpus=16 if device == "cpu" else None)  # logical CPUs: one per worker bundle
    out = chapter4(use_gpu=device == "cuda", sizes=SEED_SIZES if device == "cuda" else CPU_SIZES)
    world_size, tp_size, pp_size, dp_size = out["sizes"]
    print("world_size, tp_size, pp_size, dp_size:", world_size, tp_size, pp_size, dp_size)
    print("output shape:", out["output"][0].shape)
    print("rank 0 shards:", {name: tuple(w.shape) for name, w in out["weights"][0].items()})
    expected = unsharded_output(out["weights"][:tp_size], out["x"], device)
    print("max |tensor-parallel - unsharded|:", (out["output"][0] - expected).abs().max().item())
    ray.shutdown()
