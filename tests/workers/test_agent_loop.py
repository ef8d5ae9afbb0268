"""The multi-turn agent loop on a tiny model: real hermes parsing, real tools, scripted assistant turns."""

import pytest
import torch

from tests.workers.agent_helpers import call, chat_tokenizer, make_loop, peaked_model, run

R = 200


@pytest.fixture(scope="module")
def tokenizer():
    return chat_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return peaked_model(tokenizer)


def model_text(tokenizer, tensors, row):
    ids = tensors["responses"][row][tensors["response_mask"][row].bool()]
    return tokenizer.decode(ids.tolist(), skip_special_tokens=False)


def tool_text(tokenizer, tensors, row):
    length = tensors["responses"].shape[1]
    response_part = tensors["attention_mask"][row, -length:].bool() & ~tensors["response_mask"][row].bool()
    return tokenizer.decode(tensors["responses"][row][response_part].tolist(), skip_special_tokens=False)


def test_a_calculator_call_runs_and_its_answer_is_a_tool_turn(tokenizer, model):
    loop = make_loop(tokenizer)
    turns = [[call("calculator", expression="6*7"), "#### 42"], ["#### 5"]]
    tensors, stats, _ = run(loop, model, tokenizer, ["q6*7", "q5"], turns, R)
    # the mask marks exactly the model's tokens: the scripted turns, each ending with EOS
    assert model_text(tokenizer, tensors, 0) == turns[0][0] + "<eos>" + turns[0][1] + "<eos>"
    assert model_text(tokenizer, tensors, 1) == "#### 5<eos>"
    # the tool turn is the chat template's continuation: the rest of the assistant turn, the tool turn, the next prompt
    assert tool_text(tokenizer, tensors, 0) == "\n<|tool|>42<eos>\n<|assistant|>"
    assert tool_text(tokenizer, tensors, 1) == ""
    assert list(stats["stop_reason"]) == ["answer", "answer"]
    assert list(stats["tool_call_counts"]) == [1, 0] and list(stats["tool_error_counts"]) == [0, 0]
    assert list(stats["__num_turns__"]) == [4, 2]  # user, assistant, tool, assistant (verl's count)
    assert list(stats["tool_response_tokens"]) == [len("\n<|tool|>42") + 1 + len("\n<|assistant|>"), 0]
    assert not any(stats["tokenization_mismatch"])  # turn by turn == the whole conversation tokenized at once
    # attention covers every real token; positions continue through the tool turn
    valid = tensors["attention_mask"][0]
    assert torch.equal(tensors["position_ids"][0][valid.bool()], torch.arange(int(valid.sum())))


@pytest.mark.parametrize(
    "turn, message",
    [
        ("<tool_call>{oops</tool_call>", "Error: the tool call is not valid JSON"),
        ("<tool_call>" + '{"name": "calculator"', "Error: the tool call is not closed"),
        (call("nope", x=1), "Error: unknown tool 'nope'"),
        (call("boom"), "Error: the tool 'boom' failed: RuntimeError: the tool broke"),
        (call("slow"), "Error: the tool 'slow' failed: the tool did not answer within 0.5 s"),
        (call("hang"), "Error: the tool 'hang' failed: the tool did not answer within 0.5 s"),
        (call("rubbish"), "Error: the tool 'rubbish' failed: returned object"),
        (call("calculator", expression="__import__('os')"), "Error: Call is not allowed"),
    ],
)
def test_a_failing_call_becomes_the_tools_message_and_the_trajectory_goes_on(tokenizer, model, turn, message):
    loop = make_loop(tokenizer)
    tensors, stats, _ = run(loop, model, tokenizer, ["q"], [[turn, "#### 1"]], R)
    assert tool_text(tokenizer, tensors, 0).startswith(f"\n<|tool|>{message}")
    assert model_text(tokenizer, tensors, 0).endswith("#### 1<eos>")  # the model answered after the error
    assert (stats["stop_reason"][0], stats["tool_call_counts"][0], stats["tool_error_counts"][0]) == ("answer", 1, 1)


def test_verls_lifecycle_create_execute_release_per_call_with_agent_data(tokenizer, model):
    """verl 0.9: every call creates an instance with the row's create_kwargs, executes with agent_data (the
    conversation so far, extra_fields shared by the trajectory's calls) and releases it; the score is the last
    call's calc_reward; the step rewards add up."""
    loop = make_loop(tokenizer, max_parallel_calls=2)
    echo = loop.toolbox.tools["echo"]
    turns = [
        [call("echo", text="a") + call("echo", text="b") + call("echo", text="dropped"), call("echo", text="c"), "done"]
    ]
    tensors, stats, _ = run(
        loop, model, tokenizer, ["q"], turns, 400, tools_kwargs=[{"echo": {"create_kwargs": {"bonus": 10.0}}}]
    )
    assert tool_text(tokenizer, tensors, 0) == (
        "\n<|tool|>a<eos>\n<|tool|>b<eos>\n<|assistant|>\n<|tool|>c<eos>\n<|assistant|>"
    )  # only 2 calls per turn run
    assert stats["tool_call_counts"][0] == 3 and stats["tool_rewards"][0] == pytest.approx(0.75)
    assert stats["reward_scores"][0] == {"echo": 13.0}  # the last call's instance: bonus + the trajectory's 3 calls
    assert len(echo.created) == 3 and sorted(echo.released) == sorted(echo.created) and not echo.state
    (first, roles), *rest = echo.seen
    assert roles == ["user", "assistant"] and all(request == first for request, _ in rest)
    assert echo.seen[-1][1] == ["user", "assistant", "tool", "tool", "assistant"]


def test_turn_and_length_limits_and_single_turn_rows(tokenizer, model):
    loop = make_loop(tokenizer, max_assistant_turns=2)
    three_calls = [call("calculator", expression=f"{i}+1") for i in range(3)]
    tensors, stats, _ = run(
        loop,
        model,
        tokenizer,
        ["a", "b", "c"],
        [three_calls, three_calls, ["x" * 400]],
        300,
        agent_names=["tool_agent", "single_turn_agent", None],
    )
    assert list(stats["stop_reason"]) == ["turn_limit", "answer", "length_limit"]
    assert list(stats["tool_call_counts"]) == [1, 0, 0]  # the second turn's call is past the limit: not run
    assert list(stats["__num_turns__"]) == [4, 2, 2]
    assert tensors["response_mask"][2].all() and tensors["response_mask"][1].sum() == len(three_calls[0]) + 1
    # a tool turn that does not fit leaves the budget's end to the model: the last valid token is the model's
    tight = make_loop(tokenizer)
    tensors, stats, _ = run(tight, model, tokenizer, ["a"], [[call("calculator", expression="1+1"), "#### 2"]], 90)
    assert stats["stop_reason"][0] == "length_limit" and stats["tool_call_counts"][0] == 1
    assert tensors["response_mask"][0].sum() == tensors["attention_mask"][0, -90:].sum()


def test_the_cache_across_turns_equals_recomputing_the_whole_conversation(tokenizer, model):
    """Greedy tokens after a tool turn (fed step by step, or in one chunk when every row is in a tool turn)
    are the argmax of a from-scratch forward over the whole conversation."""
    loop = make_loop(tokenizer)
    first = [call("calculator", expression="2+3")]
    tensors, stats, _ = run(loop, model, tokenizer, ["aaa", "b", "cc"], [first, first, ["xyz"]], 120)
    assert list(stats["tool_call_counts"]) == [1, 1, 0]
    with torch.no_grad():
        logits = model(
            input_ids=tensors["input_ids"],
            attention_mask=tensors["attention_mask"],
            position_ids=tensors["position_ids"],
        ).logits
    predicted = logits[:, -121:-1].argmax(-1)  # position t predicts response token t
    free = tensors["response_mask"].bool().clone()
    for row, scripted in enumerate([len(first[0]) + 1, len(first[0]) + 1, 4]):
        free[row, :scripted] = False  # the scripted turn's tokens were forced by the logits processor
    assert free.sum() > 20
    assert torch.equal(predicted[free], tensors["responses"][free])


def test_the_rollouts_log_probs_are_a_forward_over_the_conversation(tokenizer, model):
    """rollout.calculate_log_probs with tools: each model token's log-prob is a from-scratch forward's over the
    whole conversation (the old log-probs of an on-policy step), the scripted ones included (they are scored
    under the policy, before the logits processor); tool tokens and padding get 0."""
    loop = make_loop(tokenizer)
    first = [call("calculator", expression="2+3")]
    tensors, _, _ = run(loop, model, tokenizer, ["aaa", "cc"], [first, ["xyz"]], 80, return_log_probs=True)
    with torch.no_grad():
        logits = model(
            input_ids=tensors["input_ids"],
            attention_mask=tensors["attention_mask"],
            position_ids=tensors["position_ids"],
        ).logits[:, -81:-1]
    expected = torch.log_softmax(logits.float(), -1).gather(-1, tensors["responses"][..., None]).squeeze(-1)
    model_tokens = tensors["response_mask"].bool()
    assert (~model_tokens).any() and model_tokens.sum() > 20  # a tool turn and padding, and model turns
    torch.testing.assert_close(tensors["rollout_log_probs"][model_tokens], expected[model_tokens], atol=1e-4, rtol=0)
    assert not tensors["rollout_log_probs"][~model_tokens].any()
    assert "rollout_log_probs" not in run(make_loop(tokenizer), model, tokenizer, ["aaa"], [first], 40)[0]


@pytest.mark.parametrize("remove_padding", [False, True])
def test_the_loss_has_no_gradient_on_tool_tokens(tokenizer, model, remove_padding):
    """Policy loss, entropy bonus and KL loss over a multi-turn batch: the gradient reaching the logits that
    predict tool tokens is exactly zero, and it is not zero on the model's tokens."""
    from tests.workers.helpers import actor_config
    from workers.compute.actor import DataParallelPPOActor
    from workers.compute.packing import mini_batch_totals

    loop = make_loop(tokenizer)
    turns = [[call("calculator", expression="6*7"), "#### 42"], [call("boom"), "no"]]
    tensors, _, _ = run(loop, model, tokenizer, ["q1", "q2"], turns, 160)
    response_mask = tensors["response_mask"].float()
    tool_tokens = tensors["attention_mask"][:, -160:].bool() & ~response_mask.bool()
    assert tool_tokens.sum() > 20
    micro = dict(
        tensors,
        advantages=torch.randn(response_mask.shape) * response_mask,
        old_log_probs=torch.full(response_mask.shape, -4.0),
        ref_log_prob=torch.full(response_mask.shape, -4.5),
    )
    config = actor_config(use_kl_loss=True, kl_loss_type="low_var_kl", entropy_coeff=0.01)
    actor = DataParallelPPOActor(model, None, None, config, use_remove_padding=remove_padding)
    captured = []

    def keep(module, inputs, out):
        out.retain_grad()
        captured.append(out)

    handle = model.lm_head.register_forward_hook(keep)
    try:
        loss, _ = actor._micro_loss(micro, 1.0, mini_batch_totals(response_mask).global_batch())
        loss.backward()
    finally:
        handle.remove()
        model.zero_grad(set_to_none=True)
    grad = captured[0].grad
    # the head's output (hidden states with the fused head) at each row that predicts a response token
    # (padded: the R predictor positions, kept in order)
    if remove_padding:
        from workers.compute.packing import pack_batch, pack_width

        packed = pack_batch(
            tensors["input_ids"], tensors["attention_mask"], 160, pack_width(model, tensors["attention_mask"])
        )
        per_token = packed.unpack(packed.gather(grad).abs().sum(-1))
    else:
        per_token = grad.abs().sum(-1)
    assert per_token[tool_tokens].abs().max() == 0
    assert (per_token[response_mask.bool()] > 0).float().mean() > 0.9


def test_a_template_that_rewrites_history_still_trains_on_what_was_sampled(model):
    """A chat template that renders an earlier assistant turn differently from what the model generated (as Qwen3
    drops reasoning): turn by turn, nothing the model wrote is re-rendered, so the training tokens are the sampled
    ones and the tool turn is the template's (the checker, python -m workers.tools.check_template, reports the
    rewrite)."""
    from tests.data.gsm8k_fixture import printable_tokenizer
    from tests.workers.agent_helpers import TEMPLATE

    rewriting = printable_tokenizer(TEMPLATE.replace("{{ m['content'] }}", "{{ m['content'] | replace('7', 'x') }}"))
    turns = [[call("calculator", expression="6*7"), "#### 42"]]
    tensors, stats, _ = run(make_loop(rewriting), model, rewriting, ["q"], turns, R)
    assert model_text(rewriting, tensors, 0) == turns[0][0] + "<eos>#### 42<eos>"  # the 7 stays a 7
    assert tool_text(rewriting, tensors, 0) == "\n<|tool|>42<eos>\n<|assistant|>"
    assert not stats["tokenization_mismatch"][0] and stats["stop_reason"][0] == "answer"
