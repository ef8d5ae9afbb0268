"""Token-exact multi-turn rollouts: the training tokens are the ones the model sampled (recorded by the test's own
sampler, not by the agent loop), the tool turns are the chat template's, per template family (the test
template, ChatML as Qwen writes it, Llama 3's, SmolLM2's real tokenizer and model), and the sanity check flags
an engine that hands back other tokens than it sampled."""

import pytest
import torch

from tests.workers.agent_helpers import (
    Script,
    call,
    chat_tokenizer,
    chatml_tokenizer,
    llama3_tokenizer,
    make_loop,
    peaked_model,
    prompt_batch,
    run,
)
from workers.compute.turn_sampler import HFTurnSampler, TurnSampler
from workers.tools.turns import TurnBuilder

CALC = call("calculator", expression="1+2")
# the tool turn after a call answered "3": the rest of the turn end, the tool turn, the next generation prompt
TOOL_TURNS = {
    "tiny": "\n<|tool|>3<eos>\n<|assistant|>",
    "chatml": "\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    "llama3": (
        "<|start_header_id|>ipython<|end_header_id|>\n\n3<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    ),
}
TOKENIZERS = {"tiny": chat_tokenizer, "chatml": chatml_tokenizer, "llama3": llama3_tokenizer}


def assert_trained_on_what_was_sampled(tensors, script: Script) -> None:
    """Every token the model sampled sits at its position, trained on (response_mask 1), and nothing else is."""
    responses, trained = tensors["responses"], tensors["response_mask"].bool()
    assert script.sampled and int(trained.sum()) == len(script.sampled)
    for (row, t), token in script.sampled.items():
        assert responses[row, t] == token and trained[row, t], (row, t)


def tool_text(tokenizer, tensors, row) -> str:
    length = tensors["responses"].shape[1]
    fed = tensors["attention_mask"][row, -length:].bool() & ~tensors["response_mask"][row].bool()
    return tokenizer.decode(tensors["responses"][row][fed].tolist(), skip_special_tokens=False)


@pytest.mark.parametrize("family", ["tiny", "chatml", "llama3"])
def test_training_tokens_are_the_sampled_ones_and_tool_turns_the_templates(family):
    tokenizer = TOKENIZERS[family]()
    eos = [tokenizer.eos_token_id]
    end = eos
    if family == "llama3":  # a call turn may end with <|eom_id|>: a stop token, taken as the template's <|eot_id|>
        end = [tokenizer.convert_tokens_to_ids("<|eom_id|>")]
        eos = eos + end
    # row 0: a call whose text spells a special token character by character (re-tokenising it would give one
    # token), then free sampling; row 1: the call and the answer as the template writes them; row 2: free sampling
    spelled = tokenizer.encode(CALC, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids(c) for c in "<eos>"]
    turns = [[spelled + end], [tokenizer.encode(CALC, add_special_tokens=False) + end, "#### 3"], []]
    script = Script(tokenizer, turns, sample=True)
    loop = make_loop(tokenizer)
    tensors, stats, _ = run(loop, peaked_model(tokenizer), tokenizer, ["q", "q", "qq"], script, 200, eos_token_id=eos)
    assert_trained_on_what_was_sampled(tensors, script)
    assert tokenizer.encode(tokenizer.decode(spelled), add_special_tokens=False) != spelled  # not canonical
    assert tool_text(tokenizer, tensors, 0).startswith(TOOL_TURNS[family])
    assert tool_text(tokenizer, tensors, 1) == TOOL_TURNS[family]
    assert not any(stats["tokenization_mismatch"]) and stats["stop_reason"][1] == "answer"
    # a conversation the model wrote as the template would: turn by turn == the whole conversation rendered at once
    # (which also closes the last turn the template's way)
    real = tensors["attention_mask"][1].bool()
    built = tokenizer.decode(tensors["input_ids"][1][real].tolist(), skip_special_tokens=False)
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": CALC},
        {"role": "tool", "content": "3"},
        {"role": "assistant", "content": "#### 3"},
    ]
    whole = tokenizer.apply_chat_template(messages, tools=loop.toolbox.schemas, tokenize=False)
    assert whole == built.replace("<|eom_id|>", "<|eot_id|>") + TurnBuilder(tokenizer).after_closing


class Rewriting(TurnSampler):
    """An engine that hands back one sampled token changed (as one that re-tokenised its text would)."""

    def __init__(self, model, script, old: str, new: str, tokenizer) -> None:
        self.inner, self.old, self.new = HFTurnSampler(model, script), old, new
        self.ids = tokenizer.convert_tokens_to_ids(old), tokenizer.convert_tokens_to_ids(new)

    def __call__(self, *args, **kwargs):
        out = self.inner(*args, **kwargs)
        at = (out.responses[0] == self.ids[0]).nonzero()[0, 0]
        out.responses[0, at] = self.ids[1]
        return out


@pytest.mark.parametrize(
    "mode, old, new, flagged",
    [
        ("strict", "q", "x", True),
        ("strict", " ", "\n", True),
        ("ignore_strippable", " ", "\n", False),  # whitespace only
        ("ignore_strippable", "q", "x", True),
        ("disable", "q", "x", False),
    ],
)
def test_the_sanity_check_flags_tokens_that_differ_from_the_sampled_ones(mode, old, new, flagged):
    tokenizer = chat_tokenizer()
    loop = make_loop(tokenizer, tokenization_sanity_check_mode=mode)
    script = Script(tokenizer, [[call("calculator", expression="1 + q"), "#### 3"]])
    batch = prompt_batch(tokenizer, ["q"], loop.toolbox.schemas)
    _, stats, _ = loop.generate(
        Rewriting(peaked_model(tokenizer), script, old, new, tokenizer),
        batch,
        {"raw_prompt": [[{"role": "user", "content": "q"}]]},
        response_length=160,
        eos_token_id=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
        sampling={"do_sample": False},
    )
    assert bool(stats["tokenization_mismatch"][0]) == flagged


def split_one_token(tokenizer, ids: list[int]) -> list[int]:
    """``ids`` with its first multi-character token written as two tokens (a split BPE never produces)."""
    for i, piece in enumerate(tokenizer.convert_ids_to_tokens(ids)):
        halves = tokenizer.convert_tokens_to_ids([piece[:1], piece[1:]]) if len(piece) > 1 else []
        if halves and tokenizer.unk_token_id not in halves and None not in halves:
            return ids[:i] + halves + ids[i + 1 :]
    raise AssertionError("no token to split")


def test_smollm2s_tokenizer_keeps_a_split_the_tokenizer_would_not_make(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    split = split_one_token(tokenizer, tokenizer.encode(CALC, add_special_tokens=False)) + [tokenizer.eos_token_id]
    assert tokenizer.encode(tokenizer.decode(split), add_special_tokens=False) != split
    script = Script(tokenizer, [[split], [CALC, "#### 3"]], sample=True)
    tensors, stats, _ = run(make_loop(tokenizer), peaked_model(tokenizer), tokenizer, ["q", "q"], script, 96)
    assert_trained_on_what_was_sampled(tensors, script)
    assert tensors["responses"][0, : len(split)].tolist() == split
    for row in (0, 1):
        assert tool_text(tokenizer, tensors, row).startswith("\n<|im_start|>tool\n3<|im_end|>\n<|im_start|>assistant\n")
    assert not any(stats["tokenization_mismatch"])


@pytest.mark.slow  # converts the packaged 135 M model (~40 s), then samples 4 conversations
def test_smollm2_sampling_with_the_calculator_trains_on_what_it_sampled(smollm2_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from data.preprocess.arith import TOOL_EXAMPLE, TOOL_SYSTEM

    tokenizer = AutoTokenizer.from_pretrained(smollm2_model_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_model_dir, dtype=torch.float32).eval()
    loop = make_loop(tokenizer, timeout_s=5.0, max_assistant_turns=3)
    question = "Mia has 12 apples. Then Mia buys 30 more. How many apples does Mia have now?"
    conversation = [{"role": "system", "content": TOOL_SYSTEM}, *TOOL_EXAMPLE, {"role": "user", "content": question}]
    rendered = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tokenizer.encode(rendered, add_special_tokens=False)] * 4)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(ids.shape[1])}
    batch["position_ids"] = batch["position_ids"].expand_as(ids)
    script = Script(tokenizer, [[]] * 4, sample=True, seed=1)
    tensors, stats, _ = loop.generate(
        model,
        batch,
        {"raw_prompt": [conversation] * 4},
        response_length=96,
        eos_token_id=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
        sampling={"do_sample": False},
        logits_processor=script,
    )
    assert_trained_on_what_was_sampled(tensors, script)
    assert not any(stats["tokenization_mismatch"])
