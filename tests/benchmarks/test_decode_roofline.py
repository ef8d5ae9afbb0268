"""``benchmarks.decode_step.roofline``: the bytes a decode step reads are the model's matmul weights and its whole
KV cache, and the machine's streaming rate is measured."""

from transformers import AutoModelForCausalLM

from benchmarks.decode_step import roofline
from tests.workers.helpers import build_tiny_checkpoint


def test_the_roofline_counts_every_matmul_weight_and_the_whole_cache(tmp_path):
    model = AutoModelForCausalLM.from_pretrained(build_tiny_checkpoint(tmp_path)).eval()
    config, rows, length = model.config, 4, 10
    bound = roofline(model, rows, length)
    size = model.lm_head.weight.element_size()
    matmuls = [p for name, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in name]
    tied = config.tie_word_embeddings  # the head is the embedding, read once as the head
    weight_bytes = (sum(p.numel() for p in matmuls) + (model.lm_head.weight.numel() if tied else 0)) * size
    head_dim = config.hidden_size // config.num_attention_heads
    cache = 2 * config.num_hidden_layers * rows * config.num_key_value_heads * length * head_dim * size
    assert bound["weight_bytes"] == weight_bytes
    assert bound["cache_bytes"] == cache
    assert bound["stream_gb_s"] > 0 and min(bound["linears_alone_ms"], bound["attention_alone_ms"]) >= 0
