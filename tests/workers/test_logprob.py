"""Token statistics from hidden states (workers.compute.logprob): the fused head equals the full logits, through LoRA
and the exact KL, padded and packed; which heads it applies to; the LM-head override."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, LlamaConfig

from algos.distillation import topk_log_probs_from_logits
from config.sections import ModelConfig
from tests.workers.helpers import make_update_batch
from workers.compute.logprob import hidden_states_out, output_head, teacher_scores, token_stats
from workers.compute.rollout import generate_sequences
from workers.parallel import lora

P, R, ROWS = 6, 5, 6


def _model(path, lora_rank=0):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model = lora.add_adapters(model, ModelConfig(lora_rank=lora_rank, lora_alpha=8))
    with torch.no_grad():  # adapters away from their zero init, so the policy differs from its reference
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    return model


def _stats_and_grads(model, batch, fused, remove_padding, with_kl):
    model.zero_grad(set_to_none=True)
    stats = token_stats(model, batch, R, 0.7, remove_padding, fused, ref_module=model if with_kl else None)
    g = torch.Generator().manual_seed(2)
    terms = [stats["log_probs"], stats["entropy"]] + ([stats["kl"]] if with_kl else [])
    sum((torch.randn(ROWS, R, generator=g) * t).sum() for t in terms).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return [t.detach() for t in terms], grads


@pytest.mark.parametrize("remove_padding", [False, True], ids=["padded", "remove-padding"])
@pytest.mark.parametrize("lora_rank", [0, 4], ids=["full", "lora"])
def test_fused_equals_the_full_logits_in_values_and_gradients(tiny_model_dir, remove_padding, lora_rank):
    """log π, entropy and the exact KL to the adapters-off reference, and every trained parameter's gradient
    (the tied embedding / LM head included when it trains), within fp32 tolerance."""
    model = _model(tiny_model_dir, lora_rank)
    batch = make_update_batch(ROWS, P, R).batch
    with_kl = lora_rank > 0  # the reference is the model with its adapters off
    want, want_grads = _stats_and_grads(model, batch, False, remove_padding, with_kl)
    got, got_grads = _stats_and_grads(model, batch, True, remove_padding, with_kl)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert set(got_grads) == set(want_grads) and len(got_grads) > 0
    assert (output_head(model).weight.grad is not None) == (lora_rank == 0)  # tied to the embedding here
    for name, grad in got_grads.items():
        torch.testing.assert_close(grad, want_grads[name], rtol=1e-4, atol=1e-5)
    if with_kl:
        assert (got[2] > 1e-4).any()


def _full_log_softmax(model, batch, temperature):
    """(B, R, V) log-softmax of the full logits at the positions that predict each response token."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return torch.log_softmax(logits[:, -R - 1 : -1].float() / temperature, dim=-1)


@pytest.mark.parametrize("remove_padding", [False, True], ids=["padded", "remove-padding"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "logits"])
def test_teacher_scores_and_the_students_topk_log_probs_equal_the_full_log_softmax(
    tiny_model_dir, remove_padding, fused
):
    """The teacher's top-k ids and log-probs and its sampled tokens' log-probs, and the student's log-probs at
    those ids (with their gradient), equal the full logits' log-softmax, padded and packed, zero off the response."""
    model = _model(tiny_model_dir)
    batch = make_update_batch(ROWS, P, R).batch
    valid = batch["response_mask"].bool()
    with torch.no_grad():
        full = _full_log_softmax(model, batch, 1.0)
    scores = teacher_scores(model, batch, R, remove_padding, fused, topk=4)
    values, ids = full.topk(4, dim=-1)
    assert torch.equal(scores["topk_ids"][valid], ids[valid]) and not scores["topk_ids"][~valid].any()
    torch.testing.assert_close(scores["topk_log_probs"][valid], values[valid], rtol=1e-5, atol=1e-5)
    sampled = full.gather(-1, batch["responses"][..., None]).squeeze(-1)
    torch.testing.assert_close(scores["log_probs"], sampled * valid, rtol=1e-5, atol=1e-5)
    assert set(teacher_scores(model, batch, R, remove_padding, fused)) == {"log_probs"}

    stats = token_stats(model, batch, R, 0.7, remove_padding, fused, (), topk_ids=scores["topk_ids"])
    student = topk_log_probs_from_logits(_full_log_softmax(model, batch, 0.7), scores["topk_ids"])
    torch.testing.assert_close(stats["topk_log_probs"], student * valid[..., None], rtol=1e-5, atol=1e-5)
    stats["topk_log_probs"].sum().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    (student * valid[..., None]).sum().backward()
    for name, grad in got.items():
        torch.testing.assert_close(grad, dict(model.named_parameters())[name].grad, rtol=1e-3, atol=1e-4)


def test_models_whose_logits_transform_the_head_output_keep_their_head():
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    model = AutoModelForCausalLM.from_config(config)
    assert output_head(model) is model.lm_head
    for key, value in (("final_logit_softcapping", 30.0), ("logit_scale", 0.0625)):
        setattr(model.config, key, value)
        assert output_head(model) is None
        setattr(model.config, key, None)
    lora_head = lora.add_adapters(
        AutoModelForCausalLM.from_config(config), ModelConfig(lora_rank=2, target_modules=["lm_head", "q_proj"])
    )
    assert output_head(lora_head) is None  # a LoRA adapter on the head: the model applies it


def test_the_head_override_returns_hidden_states_nests_and_restores(tiny_model_dir):
    model = _model(tiny_model_dir)
    ids = torch.randint(3, 40, (2, 5))
    logits = model(input_ids=ids).logits
    head = output_head(model)
    with hidden_states_out(head):
        with hidden_states_out(head):
            hidden = model(input_ids=ids).logits
        assert model(input_ids=ids).logits.shape == hidden.shape == (2, 5, model.config.hidden_size)
    torch.testing.assert_close(torch.nn.functional.linear(hidden, head.weight), logits)
    assert "forward" not in head.__dict__ and torch.equal(model(input_ids=ids).logits, logits)


class _BmmOverTheHead(TorchDispatchMode):
    """Counts every aten.bmm with an operand shaped like the LM head's weight (vocabulary × hidden)."""

    def __init__(self, config) -> None:
        super().__init__()
        self.head_dims, self.calls = {config.vocab_size, config.hidden_size}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.bmm.default and any(self.head_dims <= set(a.shape[1:]) for a in args):
            self.calls += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("remove_padding", [False, True], ids=["padded", "remove-padding"])
def test_a_frozen_head_never_multiplies_a_batch_of_weight_copies(tiny_model_dir, remove_padding):
    """The LM head gets (rows, hidden) matrices: a strided (B, k, hidden) slice would make a frozen head (LoRA) run
    bmm against its weight expanded B times (the bf16 + LoRA stall), in log-probs, the update and the rollout."""
    model = lora.add_adapters(AutoModelForCausalLM.from_pretrained(tiny_model_dir), ModelConfig(lora_rank=4))
    batch = make_update_batch(ROWS, P, R).batch
    with _BmmOverTheHead(model.config) as old_way:  # the detector sees the pattern: HF's slice of the last positions
        model(input_ids=batch["input_ids"], logits_to_keep=R + 1)
    assert old_way.calls > 0
    with _BmmOverTheHead(model.config) as ours:
        for fused in (True, False):
            stats = token_stats(model, batch, R, 1.0, remove_padding, fused)
            stats["log_probs"].sum().backward()
        with torch.no_grad():
            generate_sequences(
                model,
                *(batch[k][:, :P] for k in ("input_ids", "attention_mask", "position_ids")),
                response_length=3,
                eos_token_id=None,
                pad_token_id=0,
            )
    assert ours.calls == 0
