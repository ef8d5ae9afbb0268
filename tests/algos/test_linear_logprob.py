"""The fused linear log-prob equals the full computation: values and gradients, in chunks, with and without a KL."""

import pytest
import torch

import algos.linear_logprob as fused
from algos import entropy_from_logits, kl_full, logprobs_from_logits
from algos.distillation import topk_log_probs_from_logits

N, H, V = 37, 16, 50


def _inputs(dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g, dtype=dtype)
    weight = torch.randn(V, H, generator=g, dtype=dtype) / H**0.5 * 3
    bias = torch.randn(V, generator=g, dtype=dtype)
    labels = torch.randint(0, V, (N,), generator=g)
    ref_hidden = hidden + 0.3 * torch.randn(N, H, generator=g, dtype=dtype)
    return hidden, weight, bias, labels, ref_hidden


def _full(hidden, weight, bias, labels, temperature, ref_hidden):
    logits = torch.nn.functional.linear(hidden, weight, bias) / temperature
    ref_logits = torch.nn.functional.linear(ref_hidden, weight, bias) / temperature
    return logprobs_from_logits(logits, labels), entropy_from_logits(logits), kl_full(logits, ref_logits)


def _three(out):
    """log-probs, entropy and the KL (None without a reference) of ``linear_log_probs``'s dict."""
    return out["log_probs"], out["entropy"], out.get("kl")


@pytest.fixture(params=[1, 7, 1000], ids=["row-chunks", "7-row-chunks", "one-chunk"])
def chunk(request, monkeypatch):
    monkeypatch.setattr(fused, "CHUNK_ELEMENTS", request.param * V)
    return request.param


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_equal_the_full_computation(chunk, temperature):
    hidden, weight, bias, labels, ref_hidden = _inputs()
    g = torch.Generator().manual_seed(1)
    weights = [torch.randn(N, generator=g, dtype=torch.float64) for _ in range(3)]  # a loss using all three

    def run(fn):
        leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
        outs = fn(*leaves)
        sum(w @ o.double() for w, o in zip(weights, outs)).backward()
        return [o.detach().double() for o in outs], [t.grad for t in leaves]

    want, want_grads = run(lambda h, w, b: _full(h, w, b, labels, temperature, ref_hidden))
    got, got_grads = run(
        lambda h, w, b: _three(fused.linear_log_probs(h, w, labels, b, temperature, ref=(ref_hidden, w, b)))
    )
    for a, b in zip(got, want):  # fp32 inside the chunks: fp32 tolerance
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_an_output_without_gradient_adds_nothing_to_backward():
    """The entropy (or KL) only logged: the gradients are those of the log-probs alone."""
    hidden, weight, bias, labels, _ = _inputs(torch.float32)
    h1, h2 = hidden.clone().requires_grad_(), hidden.clone().requires_grad_()
    out = fused.linear_log_probs(h1, weight, labels, bias)
    log_probs, entropy = out["log_probs"], out["entropy"]
    assert "kl" not in out and entropy.requires_grad
    log_probs.sum().backward()
    logprobs_from_logits(torch.nn.functional.linear(h2, weight, bias), labels).sum().backward()
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("chunk", [7, 1000], ids=["7-row-chunks", "one-chunk"])
def test_backward_recomputes_the_logits_only_when_the_rows_span_several_chunks(chunk, monkeypatch):
    """One chunk: the forward keeps its log p and backward runs no LM-head matmul for the logits; several chunks:
    backward recomputes each chunk's logits once."""
    monkeypatch.setattr(fused, "CHUNK_ELEMENTS", chunk * V)
    calls = []
    head_logits = fused.head_logits
    monkeypatch.setattr(fused, "head_logits", lambda *a: calls.append(1) or head_logits(*a))
    hidden, weight, bias, labels, _ = _inputs(torch.float32)
    hidden.requires_grad_()
    log_probs = fused.linear_log_probs(hidden, weight, labels, bias)["log_probs"]
    chunks = len(calls)
    log_probs.sum().backward()
    assert chunks == -(-N // chunk) and len(calls) - chunks == (0 if chunks == 1 else chunks)


def test_identical_policies_have_a_kl_of_exactly_zero():
    hidden, weight, bias, labels, _ = _inputs(torch.float32)
    kl = fused.linear_log_probs(hidden, weight, labels, bias, 0.7, ref=(hidden, weight, bias))["kl"]
    assert torch.equal(kl, torch.zeros(N))


def test_bf16_stays_within_a_stated_bound_of_fp32():
    """bf16 head and hidden states: log-probs within 0.05 and the gradient direction within 1 % of the fp32
    result on the same (bf16-rounded) inputs, as the unfused bf16 computation."""
    hidden, weight, bias, labels, _ = _inputs(torch.float32)
    hidden, weight = hidden.bfloat16(), weight.bfloat16()
    h16 = hidden.clone().requires_grad_()
    lp16, ent16, _ = _three(fused.linear_log_probs(h16, weight, labels))
    lp16.sum().backward()
    h32 = hidden.float().requires_grad_()
    lp32, ent32, _ = _three(fused.linear_log_probs(h32, weight.float(), labels))
    lp32.sum().backward()
    assert (lp16 - lp32).abs().max() < 0.05 and (ent16 - ent32).abs().max() < 0.05
    cosine = torch.nn.functional.cosine_similarity(h16.grad.float().flatten(), h32.grad.flatten(), dim=0)
    assert cosine > 0.99 and h16.grad.dtype == torch.bfloat16


def test_no_rows_give_empty_outputs_and_a_zero_gradient():
    """A micro-batch without response tokens: empty outputs, and backward runs (nothing kept, nothing computed)."""
    _, weight, bias, _, _ = _inputs(torch.float32)
    hidden = torch.zeros(0, H, requires_grad=True)
    out = fused.linear_log_probs(hidden, weight, torch.zeros(0, dtype=torch.long), bias)
    assert out["log_probs"].shape == out["entropy"].shape == (0,)
    out["log_probs"].sum().backward()
    assert hidden.grad.shape == (0, H)


def _topk_ids(k=6, seed=3):
    """K distinct token ids per row, as a teacher's top-k are."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(V, generator=g)[:k] for _ in range(N)])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_topk_gather_equals_the_reference_in_values_and_gradients(chunk, temperature):
    """log π at K given ids per row (a teacher's top-k) from the chunks equals ``topk_log_probs_from_logits`` on the
    full logits, and so do the gradients of a loss that uses them beside the sampled token's log-prob."""
    hidden, weight, bias, labels, _ = _inputs()
    ids = _topk_ids()
    g = torch.Generator().manual_seed(4)
    w_sampled, w_topk = torch.randn(N, generator=g, dtype=torch.float64), torch.randn(N, 6, generator=g).double()

    def run(fn):
        leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
        sampled, topk = fn(*leaves)
        (w_sampled @ sampled.double() + (w_topk * topk.double()).sum()).backward()
        return [sampled.detach().double(), topk.detach().double()], [t.grad for t in leaves]

    def reference(h, w, b):
        logits = torch.nn.functional.linear(h, w, b) / temperature
        return logprobs_from_logits(logits, labels), topk_log_probs_from_logits(logits, ids)

    def chunked(h, w, b):
        out = fused.linear_log_probs(h, w, labels, b, temperature, topk_ids=ids)
        return out["log_probs"], out["topk_log_probs"]

    want, want_grads = run(reference)
    got, got_grads = run(chunked)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_topk_gather_of_the_sampled_token_alone_equals_the_log_prob():
    """The ids may include the sampled token: its gathered log-prob is the sampled token's, and the gradient of
    the top-k output alone is that of the same log-probs computed without top-k."""
    hidden, weight, bias, labels, _ = _inputs(torch.float32)
    h1, h2 = hidden.clone().requires_grad_(), hidden.clone().requires_grad_()
    out = fused.linear_log_probs(h1, weight, labels, bias, topk_ids=labels[:, None])
    torch.testing.assert_close(out["topk_log_probs"][:, 0], out["log_probs"])
    out["topk_log_probs"].sum().backward()
    fused.linear_log_probs(h2, weight, labels, bias)["log_probs"].sum().backward()
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_teacher_scores_from_chunks_equal_the_full_logits(chunk, temperature):
    """``linear_scores``: the sampled tokens' log-probs and the top-k ids and log-probs of the full log-softmax."""
    hidden, weight, bias, labels, _ = _inputs(torch.float32)
    log_probs = torch.log_softmax(torch.nn.functional.linear(hidden, weight, bias) / temperature, dim=-1)
    got = fused.linear_scores(hidden, weight, labels, bias, temperature, k=5)
    want_values, want_ids = log_probs.topk(5, dim=-1)
    torch.testing.assert_close(got["log_probs"], log_probs.gather(-1, labels[:, None]).squeeze(-1))
    assert torch.equal(got["topk_ids"], want_ids) and got["topk_ids"].dtype == torch.int64
    torch.testing.assert_close(got["topk_log_probs"], want_values)
    assert "topk_ids" not in fused.linear_scores(hidden, weight, labels, bias, temperature)
    empty = fused.linear_scores(hidden[:0], weight, labels[:0], bias, k=5)
    assert empty["topk_ids"].shape == (0, 5) and empty["log_probs"].shape == (0,)
