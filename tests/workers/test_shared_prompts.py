"""Shared prompts (``actor.use_prefix_grouper``): the rows of a micro-batch that repeat a prompt run it once, their
responses after it in one packed row, and every log-prob, entropy and gradient is the one each row gets alone."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from single_controller import DataProto
from tests.workers.helpers import actor_config, make_update_batch
from workers.compute.actor import DataParallelPPOActor
from workers.compute.packing import PromptUnits, pack_batch, pack_for

P, R = 6, 5
GROUPS = [0, 0, 0, 4, 4, 4, 4, 7]  # the prompt each row repeats: groups of 3 and 4, and one row alone
TOL = dict(rtol=1e-5, atol=1e-5)


def test_a_shared_prompt_is_packed_once_and_each_response_sees_it_and_itself():
    """Rows 0 and 1 share the prompt [5, 6]; row 2 has its own. Prompt 3 (left-padded), response 2."""
    input_ids = torch.tensor([[0, 5, 6, 7, 8], [0, 5, 6, 9, 0], [4, 5, 6, 7, 8]])
    mask = torch.tensor([[0, 1, 1, 1, 1], [0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    units = PromptUnits.of(input_ids, mask, 2, share_prompts=True)
    assert units.unit.tolist() == [0, 0, 1] and units.offset.tolist() == [0, 2, 0] and units.lengths == [5, 5]
    packed = pack_batch(input_ids, mask, 2, width=5, units=units)
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9], [4, 5, 6, 7, 8]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 2], [0, 1, 2, 3, 4]]  # 9 sits where it does in its row
    assert packed.predictors.tolist() == [1, 2, 1, 7, 8]  # the prompt's last token predicts both first tokens
    assert packed.labels.tolist() == [7, 8, 9, 7, 8]
    sees = packed.attention_mask[:, 0].int().tolist()
    assert sees[0][3] == [1, 1, 1, 1, 0] and sees[0][4] == [1, 1, 0, 0, 1]  # 9 sees the prompt and itself
    assert sees[1] == torch.ones(5, 5).tril().int().tolist()
    alone = PromptUnits.of(input_ids, mask, 2, share_prompts=False)
    assert not alone.shared and pack_batch(input_ids, mask, 2, width=5, units=alone).attention_mask is None


def _grouped_batch() -> DataProto:
    """``make_update_batch`` whose rows repeat the prompts ``GROUPS`` names (their pad counts differ)."""
    data = make_update_batch(len(GROUPS), P, R)
    batch, index = data.batch, torch.tensor(GROUPS)
    for key in ("input_ids", "attention_mask"):
        batch[key] = torch.cat([batch[key][index, :P], batch[key][:, P:]], -1)
    prompt_positions = batch["position_ids"][index, :P]
    batch["position_ids"] = torch.cat([prompt_positions, prompt_positions[:, -1:] + torch.arange(1, R + 1)], -1)
    return data


def _actor(model_dir, attention, share, remove_padding=True, **cfg) -> DataParallelPPOActor:
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=attention)
    config = actor_config(ppo_mini_batch_size=len(GROUPS), grad_clip=1e9, **cfg)
    return DataParallelPPOActor(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        None,
        config,
        use_remove_padding=remove_padding,
        use_prefix_grouper=share,
    )


# verl's grouper runs with use_remove_padding=false: the shared rows are packed all the same
@pytest.mark.parametrize("attention, remove_padding", [("sdpa", True), ("eager", True), ("sdpa", False)])
def test_shared_prompts_give_each_rows_own_log_probs_entropy_and_gradient(tiny_model_dir, attention, remove_padding):
    data = _grouped_batch()
    cfg = dict(entropy_coeff=0.01, use_kl_loss=True, ppo_micro_batch_size_per_gpu=5)  # a group split across two
    alone = _actor(tiny_model_dir, attention, False, **cfg)
    shared = _actor(tiny_model_dir, attention, True, remove_padding, **cfg)
    ids, mask = data.batch["input_ids"], data.batch["attention_mask"]
    assert pack_for(shared.module, ids, mask, R, share_prompts=True).attention_mask is not None
    assert sum(PromptUnits.of(ids, mask, R, True).lengths) < int(mask.sum())  # fewer tokens than the rows hold
    masks = []  # the shared actor's forwards really get the shared-prompt mask
    shared.module.register_forward_pre_hook(lambda m, a, kw: masks.append(kw.get("attention_mask")), with_kwargs=True)
    valid = data.batch["response_mask"].bool()
    want = alone.compute_log_prob(data, micro_batch_size=8, temperature=0.7, calculate_entropy=True)
    got = shared.compute_log_prob(data, micro_batch_size=8, temperature=0.7, calculate_entropy=True)
    assert masks and all(m is not None and m.dim() == 4 for m in masks)
    for g, w in zip(got, want):
        torch.testing.assert_close(g[valid], w[valid], **TOL)
    before = {k: v.detach().clone() for k, v in alone.module.named_parameters()}
    metrics = [actor.update_policy(data) for actor in (alone, shared)]
    for name, p in alone.module.named_parameters():  # SGD with lr 1: the change is the gradient
        change = before[name] - p.detach()
        got_change = before[name] - dict(shared.module.named_parameters())[name].detach()
        torch.testing.assert_close(got_change, change, rtol=1e-4, atol=1e-5 * float(change.abs().max()))
    torch.testing.assert_close(metrics[1]["actor/entropy"], metrics[0]["actor/entropy"], **TOL)
