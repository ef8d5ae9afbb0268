"""MFU accounting: the FLOPs formula against torch's own FLOP counter, the peak, the memory metrics."""

from types import SimpleNamespace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, LlamaConfig

from workers.parallel import lora
from workers.runtime import perf

B, S = 3, 10


def _config(**overrides) -> LlamaConfig:
    kwargs = dict(
        vocab_size=50,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="eager",
    )  # eager: the counter sees QKᵀ and AV
    return LlamaConfig(**{**kwargs, **overrides})


def _counted(model: torch.nn.Module, backward: bool) -> int:
    ids = torch.randint(0, 50, (B, S), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        out = model(ids).logits
        if backward:
            out.sum().backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("head_dim", [None, 8], ids=["hidden/heads", "head_dim"])
def test_flops_match_torchs_count_of_a_forward_and_a_training_pass(tied, head_dim):
    model = AutoModelForCausalLM.from_config(_config(tie_word_embeddings=tied, head_dim=head_dim))
    flops = perf.FlopsModel.of(model)
    lengths = torch.full((B,), S)
    assert flops.forward_flops(lengths) == _counted(model, backward=False)
    assert flops.train_flops(lengths) == _counted(model, backward=True)


def test_lora_training_counts_no_weight_gradients_for_the_frozen_base():
    """Backward computes activation gradients through every matrix but weight gradients only for the adapters."""
    model = AutoModelForCausalLM.from_config(_config(tie_word_embeddings=True))
    model = lora.add_adapters(model, SimpleNamespace(lora_rank=4, lora_alpha=8, target_modules="all-linear"))
    flops = perf.FlopsModel.of(model)
    assert 0 < flops.trained_params < flops.matmul_params
    ids = torch.randint(0, 50, (B, S), generator=torch.Generator().manual_seed(0))
    # embeddings that require grad, as the blocks after the first see: the counter then sees every input gradient
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_()
    with FlopCounterMode(display=False) as counter:
        model(inputs_embeds=embeds).logits.sum().backward()
    lengths = torch.full((B,), S)
    assert flops.train_flops(lengths) == counter.get_total_flops()
    assert flops.train_flops(lengths) < 3 * flops.forward_flops(lengths)


def test_the_value_models_scalar_head_is_counted_and_no_lm_head():
    critic = AutoModelForTokenClassification.from_config(_config(num_labels=1))
    assert perf.FlopsModel.of(critic).forward_flops(torch.full((B,), S)) == _counted(critic, backward=False)


def test_a_model_without_the_embedding_accessor_counts_every_matrix():
    """Remote-code models may not implement get_input_embeddings: MFU must not stop them from training."""
    model = AutoModelForCausalLM.from_config(_config(tie_word_embeddings=False))
    plain = perf.FlopsModel.of(model)

    def missing():
        raise NotImplementedError

    model.get_input_embeddings = missing
    assert perf.FlopsModel.of(model).matmul_params == plain.matmul_params + 50 * 64


def test_flops_count_valid_tokens_only():
    """Padding is not model work: a sequence of 4 valid tokens costs what 4 tokens cost, whatever the pad."""
    flops = perf.FlopsModel(matmul_params=100, layers=2, attn_dim=8)
    assert flops.forward_flops(torch.tensor([4])) == 2 * 100 * 4 + 4 * 2 * 8 * 16
    assert flops.forward_flops(torch.tensor([4, 0, 4])) == 2 * flops.forward_flops(torch.tensor([4]))


def test_cpu_peak_is_a_measured_matmul_rate_and_mfu_divides_by_it():
    perf.measured_matmul_flops.cache_clear()
    rng = torch.get_rng_state()
    peak, basis = perf.peak_flops(torch.device("cpu"), torch.float32)
    assert torch.equal(torch.get_rng_state(), rng)  # sampling (and an exact resume) must not see the measurement
    assert 1e8 < peak < 1e14 and basis.startswith("measured")
    assert perf.peak_flops(torch.device("cpu"), torch.float32)[0] == peak  # measured once per process
    assert perf.mfu(2e9, 2.0, 1e10) == pytest.approx(0.1)
    assert perf.mfu(1.0, 0.0, peak) == 0.0


def test_memory_metrics_on_cpu_are_this_processes_rss_and_its_peak():
    metrics = perf.memory_metrics(torch.device("cpu"))
    assert set(metrics) == {"perf/cpu_memory_used_gb", "perf/cpu_memory_peak_gb"}
    assert 0.01 < metrics["perf/cpu_memory_used_gb"] <= metrics["perf/cpu_memory_peak_gb"] < 64


@pytest.mark.gpu
def test_gpu_peak_comes_from_the_datasheet_and_memory_from_the_allocator():
    device = torch.device("cuda")
    peak, basis = perf.peak_flops(device, torch.bfloat16)
    known = any(key in torch.cuda.get_device_name(device) for key, _ in perf.PEAK_BF16_FLOPS)
    assert basis.startswith("datasheet") == known and peak > 1e12
    torch.ones(2**20, device=device)
    assert perf.memory_metrics(device)["perf/max_memory_allocated_gb"] > 0
