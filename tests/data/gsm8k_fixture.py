"""Test assets for the GSM8K path: a five-row GSM8K copy in each input layout, a printable-character tokenizer
with a chat template, and a tiny model saved with it (all written under a test's tmp_path, nothing downloaded)."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from data.builtin import build_tiny_model
from single_controller import DataProto

GSM8K = {
    "train": [
        {
            "question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
            "answer": "Tom has 3 + 4 = <<3+4=7>>7 apples.\n#### 7",
        },
        {
            "question": "A box holds 1,000 pens. How many pens are in 2 boxes?",
            "answer": "2 * 1,000 = <<2*1000=2000>>2,000 pens.\n#### 2,000",
        },
        {"question": "Sara had 10 dollars and spent 4. How much is left?", "answer": "10 - 4 = <<10-4=6>>6\n#### 6"},
    ],
    "test": [
        {"question": "Ann reads 5 pages a day for 3 days. How many pages?", "answer": "5 * 3 = <<5*3=15>>15\n#### 15"},
        {"question": "A cake has 8 slices and 3 are eaten. How many remain?", "answer": "8 - 3 = <<8-3=5>>5\n#### 5"},
    ],
}
LAYOUTS = ("hub_parquet", "jsonl", "datasets")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def write_gsm8k(root: Path, layout: str) -> Path:
    """The GSM8K fixture under ``root`` in one input layout of ``data.preprocess.gsm8k``; returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    if layout == "datasets":
        import datasets

        datasets.DatasetDict({s: datasets.Dataset.from_list(rows) for s, rows in GSM8K.items()}).save_to_disk(str(root))
    for split, rows in GSM8K.items():
        if layout == "hub_parquet":
            (root / "main").mkdir(exist_ok=True)
            pq.write_table(pa.Table.from_pylist(rows), root / "main" / f"{split}-00000-of-00001.parquet")
        elif layout == "jsonl":
            (root / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def printable_tokenizer(chat_template: str | None = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """One token per printable ASCII character (GSM8K text, ``####`` included) plus pad/bos/eos/unk."""
    vocab = {t: i for i, t in enumerate(("<pad>", "<bos>", "<eos>", "<unk>", *string.printable))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def save_tiny_model(path: Path, tokenizer: PreTrainedTokenizerFast) -> str:
    """A randomly initialised 1-layer Llama and ``tokenizer``, saved as a Hugging Face model directory."""
    tokenizer.save_pretrained(path)
    build_tiny_model(tokenizer, hidden_size=16, num_layers=1, max_position_embeddings=512).save_pretrained(path)
    return str(path)


def response_batch(
    tokenizer: PreTrainedTokenizerFast, texts: list[str], data_source: str, ground_truth: str
) -> DataProto:
    """Responses ``texts`` (each ending in EOS, right-padded) to one question, as the reward manager receives them."""
    width = max(len(t) for t in texts) + 1
    ids = torch.full((len(texts), width), tokenizer.pad_token_id)
    mask = torch.zeros((len(texts), width), dtype=torch.long)
    for i, text in enumerate(texts):
        row = tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return DataProto.from_dict(
        {"responses": ids, "response_mask": mask},
        {
            "data_source": [data_source] * len(texts),
            "reward_model": [{"ground_truth": ground_truth}] * len(texts),
            "extra_info": [{}] * len(texts),
        },
    )
