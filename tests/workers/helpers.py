"""Tiny checkpoints, batches and configs shared by the worker tests (importable by spawned ranks too)."""

from __future__ import annotations

import dataclasses
import os
import socket
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from tokenizers import Tokenizer, models, pre_tokenizers
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from config import PPOConfig, to_config
from config.schema import AlgorithmConfig, DataConfig
from config.sections import ActorConfig, ActorRolloutRefConfig, CriticConfig, CriticModelConfig, OptimConfig
from planner import StepPlan, make_plan
from single_controller import DataProto

PAD, EOS, BOS = 0, 1, 2
TOKENS = ["<pad>", "<eos>", "<bos>", *"abcdefghijklmnopqrstuvwxyz", *"0123456789", *"<>=+-*/.,"]
VOCAB = len(TOKENS)  # 48


def build_tiny_checkpoint(path: Path, hidden: int = 32, layers: int = 2, seed: int = 0) -> str:
    """A random Llama (tied embeddings) plus a character-level tokenizer, saved as an HF model directory."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        initializer_range=0.2,  # peaked logits: greedy outputs vary with the prompt, ties are unlikely
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=BOS,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(path)
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(TOKENS)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>")
    tokenizer.save_pretrained(path)
    return str(path)


def make_prompts(batch: int, prompt_len: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded prompts: input_ids, attention_mask, position_ids (B, P); row i has i % 3 pad tokens."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, VOCAB, (batch, prompt_len), generator=g)
    attention_mask = torch.ones(batch, prompt_len, dtype=torch.long)
    for i in range(batch):
        attention_mask[i, : i % 3] = 0
    input_ids = input_ids.masked_fill(attention_mask == 0, PAD)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    return input_ids, attention_mask, position_ids


def make_update_batch(batch: int, prompt_len: int, response_len: int, seed: int = 0) -> DataProto:
    """A PPO batch with random responses (some right-padded), advantages and off-policy old log-probs."""
    g = torch.Generator().manual_seed(seed)
    input_ids, attention_mask, position_ids = make_prompts(batch, prompt_len, seed)
    responses = torch.randint(3, VOCAB, (batch, response_len), generator=g)
    lengths = torch.randint(1, response_len + 1, (batch,), generator=g)
    response_mask = (torch.arange(response_len) < lengths[:, None]).long()
    responses = responses.masked_fill(response_mask == 0, PAD)
    offsets = torch.arange(1, response_len + 1)
    tensors = {
        "responses": responses,
        "input_ids": torch.cat([input_ids, responses], -1),
        "attention_mask": torch.cat([attention_mask, response_mask], -1),
        "position_ids": torch.cat([position_ids, position_ids[:, -1:] + offsets], -1),
        "response_mask": response_mask,
        "advantages": torch.randn(batch, response_len, generator=g) * response_mask,
        # around log(1/VOCAB), so some ratios fall outside the clip range
        "old_log_probs": -3.9 + 0.5 * torch.randn(batch, response_len, generator=g),
        "ref_log_prob": -3.9 + 0.1 * torch.randn(batch, response_len, generator=g),
    }
    return DataProto.from_dict(tensors)


def actor_config(**overrides) -> ActorConfig:
    """The trainer's actor config with small batch sizes (per-rank mini 4, micro 2 unless overridden)."""
    kwargs = dict(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, optim=OptimConfig(lr=1e-2))
    kwargs.update(overrides)
    return ActorConfig(**kwargs)


def critic_config(path: str, **overrides) -> CriticConfig:
    kwargs = dict(
        model=CriticModelConfig(path=path),
        optim=OptimConfig(lr=1e-2),
        ppo_mini_batch_size=4,
        ppo_micro_batch_size_per_gpu=2,
        forward_micro_batch_size_per_gpu=3,
        rollout_n=1,
        # what the schema's interpolations resolve to from the actor's defaults (this section is built alone)
        use_dynamic_bsz=False,
        ppo_epochs=1,
        shuffle=False,
        loss_agg_mode="token-mean",
    )
    kwargs.update(overrides)
    return CriticConfig(**kwargs)


def full_weights(model: torch.nn.Module, all_ranks: bool = False) -> dict[str, torch.Tensor]:
    """The unsharded weights on CPU, gathered as the checkpoints' ``get_model_state_dict`` does (a collective under
    FSDP; without ``all_ranks`` only rank 0 gets them, the others ``{}``)."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=not all_ranks))
    return {k: v.detach().cpu() for k, v in state.items()}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_gloo(rank: int, world_size: int, port: int, timeout_s: float = 60.0) -> None:
    """Join a CPU gloo world; a short timeout turns a collective mismatch into an error instead of a hang."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))


def worker_config(
    arr: ActorRolloutRefConfig, critic: CriticConfig | None = None, n_workers: int = 2, prompts: int = 4
) -> tuple[PPOConfig, StepPlan]:
    """The resolved config (interpolations followed, as ``load_config`` gives it) around hand-built role sections,
    and its step plan for ``n_workers`` (GAE when a critic is given, so the plan has one; GRPO otherwise)."""
    sections = {
        "actor_rollout_ref": arr,
        "data": DataConfig(train_batch_size=prompts),
        "algorithm": AlgorithmConfig(adv_estimator="gae" if critic is not None else "grpo"),
    }
    if critic is not None:
        sections["critic"] = critic
    cfg = to_config(dataclasses.asdict(PPOConfig(**sections)))
    return cfg, make_plan(cfg, n_workers)
