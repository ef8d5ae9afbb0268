"""verl's quickstart command line end to end for one step on 2 CPU workers: a tiny Qwen2-architecture model with a
byte-level BPE tokenizer and a ChatML chat template, over the parquet ``python -m data.preprocess.gsm8k`` writes."""

import json
import math

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from data.preprocess.gsm8k import main as preprocess_gsm8k
from tests.data.gsm8k_fixture import GSM8K, write_gsm8k
from tests.verl_compat.cli import commands
from trainer.running.build import build_trainer
from verl_compat.cli import load_config

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SCALED = [  # this machine's batch: the 3 training questions of the fixture, 2 workers, short answers
    "data.train_batch_size=2",
    "data.max_response_length=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "critic.ppo_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
    "trainer.total_epochs=1",
    "trainer.device=cpu",
]


def bpe_qwen2(path) -> str:
    """A byte-level BPE tokenizer trained on the fixture's text, with ChatML, and a random 2-layer Qwen2."""
    texts = [row[key] for rows in GSM8K.values() for row in rows for key in ("question", "answer")]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>", padding_side="left"
    )
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(path)
    Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    ).save_pretrained(path)
    return str(path)


def test_the_quickstart_trains_a_step_of_ppo(ray_cluster, tmp_path, capsys):
    preprocess_gsm8k(["--local_dir", str(write_gsm8k(tmp_path / "raw", "jsonl")), "--out_dir", str(tmp_path / "gsm8k")])
    paths = {
        "model": bpe_qwen2(tmp_path / "qwen2"),
        "train": str(tmp_path / "gsm8k" / "train.parquet"),
        "val": str(tmp_path / "gsm8k" / "test.parquet"),
    }
    cfg = load_config(
        [
            *commands.overrides(commands.QUICKSTART, **paths),
            *SCALED,
            "trainer.logger=[console,file]",
            f"trainer.default_local_dir={tmp_path / 'run'}",
        ]
    )
    trainer = build_trainer(cfg)
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.4: " in capsys.readouterr().err  # one warning line
    assert trainer.total_training_steps == 1  # one epoch of 3 prompts in batches of 2, as verl counts it
    trainer.init_workers()
    last = trainer.fit()
    assert trainer.critic_wg is not None and trainer.plan.use_critic  # the quickstart is PPO with a critic
    assert all(math.isfinite(v) for v in last.values())
    for key in (
        "critic/vf_loss",
        "actor/pg_loss",
        "training/epoch",
        "timing_s/testing",
        "val-core/openai/gsm8k/reward/mean@1",
    ):
        assert key in last, key
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1]  # val_before_train=False: no step-0 validation
