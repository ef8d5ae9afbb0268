"""Offline assets for the default demo: a character tokenizer, a tiny Llama and the task's parquet files.

Everything is written once under a cache directory keyed by the settings, and the trainer loads it back
through the ordinary ``from_pretrained`` path, exactly as it would load a downloaded checkpoint. A short
supervised warm-up (cross-entropy on ``answer + <eos>``) teaches the output format before RL, because RL from
random init collapses onto never emitting ``<eos>`` (docs/benchmarks.md, "How the demo recipe was chosen").
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from data.tasks import make_splits

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARACTERS = "0123456789abcdefghijklmnopqrstuvwxyz +=-:>,?"
CACHE_VERSION = 1  # bump when the layout or the recipe of the cached assets changes
_DONE = "DONE.json"


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A 48-token character-level tokenizer: one token per character, left padding, no BOS added."""
    vocab = {token: i for i, token in enumerate((*SPECIAL_TOKENS, *CHARACTERS))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    backend.decoder = decoders.Fuse()
    # padding_side must go through the constructor: an attribute set afterwards is not saved.
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )


def tiny_model_config(
    tokenizer: PreTrainedTokenizerFast, hidden_size: int = 128, num_layers: int = 2, max_position_embeddings: int = 64
) -> LlamaConfig:
    """The tiny Llama's config: 4 heads, MLP 4x hidden, tied embeddings, the tokenizer's vocabulary and ids."""
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def demo_model_config(builtin: Any) -> LlamaConfig:
    """The config of the model ``prepare_builtin`` builds for the ``builtin`` section, without building it."""
    return tiny_model_config(build_char_tokenizer(), builtin.hidden_size, builtin.num_layers)


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 128,
    num_layers: int = 2,
    max_position_embeddings: int = 64,
    seed: int = 1,
) -> LlamaForCausalLM:
    """A randomly initialised float32 Llama (4 heads, MLP 4x hidden, tied embeddings)."""
    config = tiny_model_config(tokenizer, hidden_size, num_layers, max_position_embeddings)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def _sft_batch(rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerFast) -> dict[str, torch.Tensor]:
    """Right-padded ``prompt + answer + <eos>`` with labels only on ``answer + <eos>`` (-100 elsewhere)."""
    sequences, labels = [], []
    for row in rows:
        prompt_ids = tokenizer(row["prompt"])["input_ids"]
        answer_ids = tokenizer(row["reward_model"]["ground_truth"])["input_ids"] + [tokenizer.eos_token_id]
        sequences.append(prompt_ids + answer_ids)
        labels.append([-100] * len(prompt_ids) + answer_ids)
    width = max(len(s) for s in sequences)
    pad = tokenizer.pad_token_id
    return {
        "input_ids": torch.tensor([s + [pad] * (width - len(s)) for s in sequences]),
        "attention_mask": torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences]),
        "labels": torch.tensor([l + [-100] * (width - len(l)) for l in labels]),
    }


def sft_warmup(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    rows: list[dict[str, Any]],
    steps: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 1,
    log_every: int = 5,
) -> list[float]:
    """Supervised warm-up: ``steps`` AdamW steps of cross-entropy on answer+eos. Returns the losses."""
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    model.train()
    losses = []
    for step in range(1, steps + 1):
        loss = model(**_sft_batch(rng.sample(rows, min(batch_size, len(rows))), tokenizer)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % log_every == 0 or step == steps:
            print(f"[builtin] sft warm-up step {step}/{steps}  loss {loss.item():.3f}", flush=True)
    model.eval()
    return losses


def write_parquet(rows: list[dict[str, Any]], path: str | os.PathLike) -> None:
    """Rows (the dataset's layout, nested dicts allowed) -> one parquet file."""
    pq.write_table(pa.Table.from_pylist(rows), str(path))


def _cache_key(settings: dict[str, Any]) -> str:
    digest = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]
    return (
        f"{settings['task']}-h{settings['hidden_size']}-l{settings['num_layers']}"
        f"-sft{settings['sft_warmup_steps']}-{digest}"
    )


def _build(target: Path, settings: dict[str, Any]) -> None:
    """Write tokenizer, (warmed-up) model and parquet files into ``target``."""
    train, val = make_splits(settings["task"], settings["num_train"], settings["num_val"], seed=settings["seed"])
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(
        tokenizer,
        settings["hidden_size"],
        settings["num_layers"],
        settings["max_position_embeddings"],
        settings["seed"],
    )
    if settings["sft_warmup_steps"] > 0:
        sft_warmup(model, tokenizer, train, settings["sft_warmup_steps"], seed=settings["seed"])
    model_dir = target / "model"
    tokenizer.save_pretrained(model_dir)
    model.save_pretrained(model_dir)
    write_parquet(train, target / "train.parquet")
    write_parquet(val, target / "val.parquet")
    (target / _DONE).write_text(json.dumps(settings, indent=1, sort_keys=True))


def prepare_builtin(
    cache_dir: str | os.PathLike,
    task: str = "copy",
    num_train: int = 2000,
    num_val: int = 128,
    sft_warmup_steps: int = 15,
    hidden_size: int = 128,
    num_layers: int = 2,
    seed: int = 1,
    max_position_embeddings: int = 64,
) -> dict[str, str]:
    """Build (once) the built-in demo assets; returns ``dict(model_path, train_files, val_files)``.

    The directory is keyed by every setting, so a changed setting builds a fresh one and an unchanged one is
    reused. Assets are built in a temporary directory and renamed into place, so an interrupted build is
    never mistaken for a finished one.
    """
    settings = dict(
        version=CACHE_VERSION,
        task=task,
        num_train=num_train,
        num_val=num_val,
        sft_warmup_steps=sft_warmup_steps,
        hidden_size=hidden_size,
        num_layers=num_layers,
        seed=seed,
        max_position_embeddings=max_position_embeddings,
    )
    target = Path(cache_dir) / _cache_key(settings)
    if not (target / _DONE).exists():
        start = time.time()
        print(f"[builtin] building the {task!r} demo assets in {target}", flush=True)
        staging = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        threads = torch.get_num_threads()
        torch.set_num_threads(min(threads, 2))  # the demo machine may have 2 cores shared with others
        try:
            _build(staging, settings)
        finally:
            torch.set_num_threads(threads)
        if (target / _DONE).exists():  # another process finished first; keep its copy
            shutil.rmtree(staging)
        else:
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
        print(f"[builtin] assets ready in {time.time() - start:.1f}s", flush=True)
    return {
        "model_path": str(target / "model"),
        "train_files": str(target / "train.parquet"),
        "val_files": str(target / "val.parquet"),
    }
