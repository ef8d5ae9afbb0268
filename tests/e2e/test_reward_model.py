"""The reward-model worker: scores at the last valid response token, and a PPO run with the RM colocated.

The end-to-end run also turns on remove-padding and dynamic batch sizes for the actor, reference and critic,
so their FSDP passes run with packed rows and token-budget micro-batches over two real ranks.
"""

import math

import pytest
import torch
from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

from data.builtin import build_char_tokenizer
from tests.e2e.dataflow_reads import assert_declared, record_reads, recorded_reads
from tests.e2e.test_ppo_e2e import CRITIC_REQUIRED, REQUIRED, read_jsonl, tiny_config
from tests.workers.helpers import PAD, VOCAB, make_update_batch
from trainer.running.build import build_trainer
from workers.compute.reward_model import compute_rm_scores, load_reward_model

P, R = 6, 5
CONSTANT = 100.0  # the score of the hand-built constant RM; rule rewards lie in [0, 1]


def _tiny_rm_config(vocab_size: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        num_labels=1,
        pad_token_id=PAD,
        initializer_range=0.2,
    )


def build_random_rm(path) -> str:
    torch.manual_seed(0)
    LlamaForSequenceClassification(_tiny_rm_config(VOCAB)).save_pretrained(path)
    return str(path)


def build_constant_rm(path, vocab_size: int) -> str:
    """An RM whose score is CONSTANT for every sequence: attention and MLP outputs are zeroed, so the last
    hidden state is RMSNorm(embedding) = RMSNorm(ones) = ones, and the head sums CONSTANT / hidden ones."""
    model = LlamaForSequenceClassification(_tiny_rm_config(vocab_size))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.fill_(1.0)
        model.score.weight.fill_(CONSTANT / model.config.hidden_size)
    model.save_pretrained(path)
    return str(path)


def test_scores_sit_on_the_last_valid_response_token(tmp_path):
    torch.set_num_threads(1)
    model = load_reward_model(build_random_rm(tmp_path / "rm"))
    data = make_update_batch(7, P, R)
    b = data.batch
    lengths = b["response_mask"].sum(-1).long()
    b["input_ids"][0, P + lengths[0] - 1] = PAD  # an attended last token equal to the pad id (an EOS used as pad)
    rm_scores = compute_rm_scores(model, data, micro_batch_size=3)
    model.config.pad_token_id = None  # with one row cut at its last valid token, HF pools the last column
    for i in range(7):
        row = {k: b[k][i : i + 1, : P + int(lengths[i])] for k in ("input_ids", "attention_mask", "position_ids")}
        with torch.no_grad():
            direct = model(**row).logits[0, 0]
        assert rm_scores[i].nonzero().flatten().tolist() == [lengths[i] - 1]
        torch.testing.assert_close(rm_scores[i, lengths[i] - 1], direct, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def rm_run(ray_cluster, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("rm")
    cfg = tiny_config(
        tmp_path,
        "gae",
        extra=(
            "reward.reward_model.enable=true",
            f"reward.reward_model.model_path={tmp_path / 'rm'}",
            "reward.reward_model.micro_batch_size_per_gpu=3",
            "actor_rollout_ref.model.use_remove_padding=true",
            "actor_rollout_ref.actor.use_dynamic_bsz=true",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=40",  # a few rows per micro-batch
            "critic.model.use_remove_padding=true",
            "critic.use_dynamic_bsz=true",
            "critic.ppo_max_token_len_per_gpu=40",
        ),
    )
    # the built-in model's vocabulary
    build_constant_rm(cfg.reward.reward_model.model_path, len(build_char_tokenizer()))
    trainer = build_trainer(cfg)  # fills actor_rollout_ref.model.path with the built-in tiny model
    assert AutoConfig.from_pretrained(trainer.config.actor_rollout_ref.model.path).vocab_size == len(
        build_char_tokenizer()
    )
    trainer.init_workers()
    trainer.fused_wg.execute_all_sync("__ray_call__", record_reads)
    trainer.fit()
    return trainer, tmp_path, trainer.fused_wg.execute_all_sync("__ray_call__", recorded_reads)


def test_rm_score_is_added_to_the_rule_reward(rm_run):
    trainer, tmp_path, _ = rm_run
    records = read_jsonl(tmp_path / "metrics.jsonl")[1:]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        missing = [k for k in REQUIRED + CRITIC_REQUIRED if k not in record]
        assert not missing and all(math.isfinite(v) for v in record.values()), missing
        # rule reward in [0, 1] plus the RM's CONSTANT, once per sequence
        assert CONSTANT - 1e-3 <= record["critic/score/min"] <= record["critic/score/max"] <= CONSTANT + 1 + 1e-3
    assert records[0]["actor/ref_kl"] == pytest.approx(0.0, abs=1e-5)  # packed actor == packed ref


def test_rm_worker_group_scores_each_row_once(rm_run):
    trainer, *_ = rm_run
    data = make_update_batch(6, P, R)
    keys = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]
    rm_scores = trainer.rm_wg.compute_rm_score(data.select(batch_keys=keys)).batch["rm_scores"]
    lengths = data.batch["response_mask"].sum(-1).long()
    assert rm_scores.shape == (6, R)
    torch.testing.assert_close(rm_scores.sum(-1), torch.full((6,), CONSTANT), rtol=1e-5, atol=0)
    assert torch.equal(rm_scores.nonzero()[:, 1], lengths - 1)


def test_packed_phases_read_exactly_what_the_plan_declares(rm_run):
    """As in test_ppo_e2e, here with the reward model and packed rows with token-budget micro-batches."""
    trainer, _, reads = rm_run
    assert_declared(
        trainer, reads, {"gen", "rm_score", "old_log_prob", "ref", "values", "update_critic", "update_actor"}
    )


def test_a_checkpoint_without_a_score_head_is_refused(tmp_path):
    LlamaForCausalLM(_tiny_rm_config(VOCAB)).save_pretrained(tmp_path / "lm")
    with pytest.raises(ValueError, match="no `score` head"):
        load_reward_model(str(tmp_path / "lm"))
