"""The memory estimate against the real thing on a tiny model: its sizes exactly, the tensor bytes of an update and
of a generation within a loose bound (the benchmark, ``benchmarks.memory_estimate``, holds it to ±25 %)."""

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, LlamaConfig

from benchmarks.memory import allocated_peak_bytes
from config.sections import ActorConfig
from single_controller import DataProto
from trainer.preflight.memory_estimate import (
    Micro,
    activation_bytes,
    forward_transient,
    kv_cache_bytes,
    logits_bytes,
    model_sizes,
    uses_math_attention,
)
from workers.compute.actor import DataParallelPPOActor
from workers.compute.rollout import generate_sequences
from workers.parallel import lora
from workers.parallel.optim import build_optimizer

CONFIG = LlamaConfig(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=256,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    tie_word_embeddings=True,
)
P, R, ROWS = 24, 40, 16


def _model(lora_rank: int = 0) -> torch.nn.Module:
    torch.manual_seed(0)
    adapters = SimpleNamespace(lora_rank=lora_rank, lora_alpha=16, target_modules="all-linear")
    return lora.add_adapters(AutoModelForCausalLM.from_config(CONFIG), adapters)


def _batch(group: int = 1) -> DataProto:
    """Random rows; with ``group`` > 1 the rows of each group repeat its first row's prompt."""
    g = torch.Generator().manual_seed(0)
    prompt, response = (
        torch.randint(P // 2, P + 1, (ROWS,), generator=g),
        torch.randint(R // 2, R + 1, (ROWS,), generator=g),
    )
    prompt = prompt[torch.arange(ROWS) // group * group]
    columns = torch.arange(P + R)
    mask = ((columns >= P - prompt[:, None]) & (columns < P + response[:, None])).long()
    ids = torch.randint(0, CONFIG.vocab_size, (ROWS, P + R), generator=g)
    ids[:, :P] = ids[torch.arange(ROWS) // group * group, :P]
    return DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(0),
            "responses": ids[:, P:],
            "response_mask": mask[:, P:],
            "advantages": torch.randn(ROWS, R, generator=g),
        }
    )


@pytest.mark.parametrize("lora_rank", [0, 8])
def test_sizes_are_the_models(lora_rank):
    sizes, model = (
        model_sizes(CONFIG, SimpleNamespace(lora_rank=lora_rank, lora_alpha=16, target_modules="all-linear")),
        _model(lora_rank),
    )
    assert sizes.params == sum(p.numel() for p in model.parameters())
    assert sizes.trained == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert sizes.adapter_width == 7 * lora_rank and sizes.kv_dim == 32 and sizes.layers == 3
    critic = model_sizes(CONFIG, value_head=True)
    assert critic.params == sum(
        p.numel()
        for p in AutoModelForTokenClassification.from_config(
            LlamaConfig(**{**CONFIG.to_dict(), "num_labels": 1})
        ).parameters()
    )


@pytest.mark.parametrize("lora_rank, packed, group", [(0, False, 1), (8, True, 1), (8, True, 4)])
def test_an_updates_tensor_peak_is_within_a_loose_bound_of_the_estimate(lora_rank, packed, group):
    """One mini-batch in one micro-batch: the profiler's peak of allocated bytes against the estimate's
    activations (as tensors, without the CPU heap's holes), logits and gradients at the batch's mean lengths;
    ``group``: groups of 4 rows share their prompt (``use_prefix_grouper``)."""
    model, data = _model(lora_rank), _batch(group)
    optimizer = build_optimizer(model, SimpleNamespace(lr=1e-4, betas=[0.9, 0.99], weight_decay=0.0))
    actor = DataParallelPPOActor(
        model,
        optimizer,
        None,
        ActorConfig(ppo_mini_batch_size=ROWS, ppo_micro_batch_size_per_gpu=ROWS),
        ROWS,
        use_remove_padding=packed,
        use_prefix_grouper=group > 1,
    )
    actor.update_policy(data)  # the optimizer state exists before the measured update, as from step 2 on
    measured = allocated_peak_bytes(lambda: actor.update_policy(data))

    sizes = model_sizes(CONFIG, SimpleNamespace(lora_rank=lora_rank, lora_alpha=16, target_modules="all-linear"))
    prompt = int(data.batch["attention_mask"][:, :P].sum()) // ROWS
    response = int(data.batch["response_mask"].sum()) // ROWS
    tokens, width, head = Micro(ROWS, prompt, response, P + R, packed, group).geometry(sizes)
    estimate = (
        activation_bytes(sizes, tokens, width, 4, uses_math_attention(sizes, "cpu", 4, width), False)
        + logits_bytes(head, ROWS * response, sizes.vocab, 4, packed, backward=True)
        + 4 * sizes.trained
    )
    assert 2 / 3 < measured / estimate < 1.5, (measured, estimate)


def test_generations_tensor_peak_is_within_a_loose_bound_of_the_estimate():
    """Every row decodes at once over a StaticCache of prompt + response positions, after a prefill of the
    prompts; the estimate's generate phase (trainer.preflight.memory_phases) adds the sampled positions' logits."""
    model, data = _model(), _batch()
    sizes = model_sizes(CONFIG)
    batch = data.batch
    prompts = [batch[k][:, :P] for k in ("input_ids", "attention_mask", "position_ids")]
    length = 200  # long responses: the cache outweighs the prefill
    measured = allocated_peak_bytes(
        lambda: generate_sequences(model, *prompts, response_length=length, eos_token_id=None, pad_token_id=0)
    )
    estimate = (
        kv_cache_bytes(sizes, ROWS, P + length, 4) + forward_transient(sizes, ROWS * P, 4) + 4 * ROWS * sizes.vocab * 4
    )
    assert 2 / 3 < measured / estimate < 1.5, (measured, estimate)
