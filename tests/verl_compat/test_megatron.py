"""Tensor-parallel worker groups: the (pp, dp, tp) mesh, MEGATRON_COMPUTE(_PROTO) dispatch, seed 000 chapter 4."""

import pytest
import ray
import torch
import torch.distributed as dist

from examples import seed_000_ch4_tensor_parallel as ch4
from verl_compat.models.llama.megatron.layers import ParallelLlamaMLP
from verl_compat.single_controller import DataProto, DataProtoFuture
from verl_compat.single_controller.base import Worker
from verl_compat.single_controller.base.decorator import (
    Dispatch,
    collect_megatron_compute,
    dispatch_megatron_compute,
    dispatch_megatron_compute_data_proto,
    register,
)
from verl_compat.single_controller.base.megatron.worker import (
    DistRankInfo,
    MegatronWorker,
    TensorParallelWorker,
    model_parallel_shape,
)
from verl_compat.single_controller.ray import RayClassWithInitArgs, RayResourcePool
from verl_compat.single_controller.ray.megatron import NVMegatronRayWorkerGroup, TensorParallelRayWorkerGroup
from verl_compat.utils.megatron_utils import init_model_parallel_config


def megatron_layout(pp: int, dp: int, tp: int) -> list[DistRankInfo]:
    """Megatron's default rank order, tp fastest: rank = (pp_rank * dp + dp_rank) * tp + tp_rank."""
    return [DistRankInfo(tp_rank=r % tp, dp_rank=r // tp % dp, pp_rank=r // (tp * dp)) for r in range(pp * dp * tp)]


class RankLayout:
    """The rank information a tensor-parallel group carries, without processes behind it."""

    def __init__(self, pp: int, dp: int, tp: int) -> None:
        self._megatron_rank_info = megatron_layout(pp, dp, tp)


class MeshWorker(TensorParallelWorker):
    def __init__(self, tp: int, pp: int) -> None:
        super().__init__()
        torch.set_num_threads(1)
        self.init_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)

    @register(dispatch_mode=Dispatch.MEGATRON_COMPUTE)
    def tag(self, x) -> tuple:
        """The input, this rank's place, and per mesh dimension the sum of the global ranks of its group."""
        sums = {}
        for name in ("pp", "dp", "tp"):
            total = torch.tensor([self.rank])
            dist.all_reduce(total, group=self.device_mesh[name].get_group())
            sums[name] = total.item()
        return x, self.get_megatron_rank_info(), sums

    @register(dispatch_mode=Dispatch.MEGATRON_COMPUTE_PROTO)
    def add_dp_rank(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"x": data.batch["x"] + 100 * self.get_megatron_rank_info().dp_rank})

    @register(dispatch_mode=Dispatch.MEGATRON_COMPUTE_PROTO, blocking=False)
    def double_async(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"x": data.batch["x"] * 2})


@pytest.fixture(scope="module")
def pp2_dp2(ray_cluster):
    """Four ranks, rank = pp_rank * 2 + dp_rank (tp=1): each dp group spans both pipeline stages."""
    return TensorParallelRayWorkerGroup(
        RayResourcePool([4], use_gpu=False), RayClassWithInitArgs(MeshWorker, tp=1, pp=2)
    )


# ---------------------------------------------------------------------------- without processes
def test_mesh_shape_and_seed_names():
    assert model_parallel_shape(8, tensor_model_parallel_size=2, pipeline_model_parallel_size=2) == (2, 2, 2)
    assert model_parallel_shape(4, tensor_model_parallel_size=4, pipeline_model_parallel_size=1) == (1, 1, 4)
    with pytest.raises(ValueError, match="divide the world size 4"):
        model_parallel_shape(4, tensor_model_parallel_size=3, pipeline_model_parallel_size=1)
    assert MegatronWorker is TensorParallelWorker and NVMegatronRayWorkerGroup is TensorParallelRayWorkerGroup


def test_worker_without_mesh_says_what_to_call(monkeypatch):
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(RuntimeError, match="init_model_parallel"):
        TensorParallelWorker().get_megatron_rank_info()


def test_the_seeds_model_parallel_config_and_a_layer_outside_a_worker():
    config = init_model_parallel_config(
        {"tensor_model_parallel_size": 4, "param_dtype": "bf16", "sequence_parallel": False}
    )
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size) == (4, 1)
    assert config.params_dtype == torch.bfloat16
    with pytest.raises(ValueError, match="sequence_parallel"):
        init_model_parallel_config({"sequence_parallel": True})
    with pytest.raises(ValueError, match="param_dtype='fp8'; valid"):
        init_model_parallel_config({"param_dtype": "fp8"})
    with pytest.raises(RuntimeError, match="init_model_parallel"):  # no worker built a mesh in this process
        ParallelLlamaMLP({"hidden_size": 8, "intermediate_size": 8}, config)


def test_group_needs_tensor_parallel_workers():
    with pytest.raises(TypeError, match="TensorParallelWorker"):
        TensorParallelRayWorkerGroup(RayResourcePool([1], use_gpu=False), RayClassWithInitArgs(Worker))


def test_dispatch_by_dp_collect_tp0_of_last_stage(ray_cluster):
    layout = RankLayout(pp=2, dp=2, tp=2)
    (per_rank,), _ = dispatch_megatron_compute(layout, ["a", "b"])
    dp_ranks = [info.dp_rank for info in layout._megatron_rank_info]
    assert [ray.get(ref) for ref in per_rank] == [["a", "b"][dp] for dp in dp_ranks]
    assert len({ref for ref, dp in zip(per_rank, dp_ranks) if dp == 0}) == 1  # one object-store copy per dp item
    # rank = (pp * 2 + dp) * 2 + tp; tp 0 of stage 1 is rank 4 for dp 0 and rank 6 for dp 1
    assert collect_megatron_compute(layout, list(range(8))) == [4, 6]


def test_megatron_dispatch_errors():
    with pytest.raises(ValueError, match="list of length dp_size=2, got list of length 3"):
        dispatch_megatron_compute(RankLayout(pp=1, dp=2, tp=2), [1, 2, 3])
    with pytest.raises(TypeError, match="knows its ranks' tp/dp/pp ranks"):
        dispatch_megatron_compute(object(), [1])
    with pytest.raises(TypeError, match="DataProto"):
        dispatch_megatron_compute_data_proto(RankLayout(pp=1, dp=2, tp=2), [1, 2])


# ---------------------------------------------------------------------------- a pp=2, dp=2 group
def test_group_sizes_and_rank_layout(pp2_dp2):
    assert (pp2_dp2.world_size, pp2_dp2.tp_size, pp2_dp2.dp_size, pp2_dp2.pp_size) == (4, 1, 2, 2)
    assert [pp2_dp2.get_megatron_rank_info(r) for r in range(4)] == megatron_layout(pp=2, dp=2, tp=1)


def test_megatron_compute_in_dp_order_from_last_stage(pp2_dp2):
    out = pp2_dp2.tag(["first", "second"])
    assert [x for x, _, _ in out] == ["first", "second"]
    assert [info for _, info, _ in out] == [DistRankInfo(tp_rank=0, dp_rank=0, pp_rank=1), DistRankInfo(0, 1, 1)]
    # collected from ranks 2 and 3; pp groups {0, 2}, {1, 3}; dp group {2, 3}; tp groups {2}, {3}
    assert [sums for _, _, sums in out] == [{"pp": 2, "dp": 5, "tp": 2}, {"pp": 4, "dp": 5, "tp": 3}]
    assert [x for x, _, _ in pp2_dp2.tag(x=("kw0", "kw1"))] == ["kw0", "kw1"]
    with pytest.raises(ValueError, match="dp_size=2"):
        pp2_dp2.tag(["only one"])


@pytest.mark.parametrize("n", [4, 5])
def test_megatron_compute_proto_chunks_by_dp(pp2_dp2, n):
    out = pp2_dp2.add_dp_rank(DataProto.from_dict({"x": torch.arange(n)}))
    half = -(-n // 2)
    assert out.batch["x"].tolist() == [i + 100 * (i // half) for i in range(n)]  # padded to 6 for n=5, trimmed back


def test_megatron_compute_proto_future(pp2_dp2):
    future = pp2_dp2.double_async(DataProto.from_dict({"x": torch.arange(4)}))
    assert isinstance(future, DataProtoFuture)
    assert pp2_dp2.add_dp_rank(future).batch["x"].tolist() == [0, 2, 104, 106]  # dp rank i resolves future i
    assert pp2_dp2.double_async(DataProto.from_dict({"x": torch.arange(3)})).get().batch["x"].tolist() == [0, 2, 4]


# ---------------------------------------------------------------------------- seed 000, chapter 4
def check_chapter4(out: dict, sizes: dict, device: str) -> None:
    hidden, ffn, tp = sizes["hidden_size"], sizes["ffn_hidden_size"], 4
    assert out["sizes"] == (4, tp, 1, 1)
    x, (y,) = out["x"], out["output"]
    assert y.shape == x.shape == (sizes["seq_len"], sizes["batch_size"], hidden)
    shapes = {
        "gate_proj.weight": (ffn // tp, hidden),
        "up_proj.weight": (ffn // tp, hidden),
        "down_proj.weight": (hidden, ffn // tp),
    }
    for shards in out["weights"]:
        assert {name: tuple(w.shape) for name, w in shards.items()} == shapes
    assert not torch.equal(out["weights"][0]["down_proj.weight"], out["weights"][1]["down_proj.weight"])
    expected = ch4.unsharded_output(out["weights"], x, device)
    assert torch.allclose(y, expected, rtol=1e-4, atol=1e-5), (y - expected).abs().max()


def test_seed_000_chapter4_tp_mlp_on_cpu(ray_cluster):
    check_chapter4(ch4.chapter4(use_gpu=False, sizes=ch4.CPU_SIZES), ch4.CPU_SIZES, "cpu")


@pytest.mark.gpu(n=4)
def test_seed_000_chapter4_tp_mlp_seed_sizes_on_gpu(ray_cluster):
    check_chapter4(ch4.chapter4(use_gpu=True, sizes=ch4.SEED_SIZES), ch4.SEED_SIZES, "cuda")
