"""Per-token data declared once (planner.phases.declare_flows): the routes derived from it, and the workers' step store
that keeps a step's tensors where they are next read (workers/compute/step_store.py)."""

import pytest
import torch

from planner import load_config, make_plan
from planner.dataflow import DRIVER, WORKER, Dataflow, Phase
from single_controller import DataProto
from trainer.running.routing import request, take_back
from workers.compute.step_store import ROWS, STEP, StepCall, StepStore, StepStoreError

ROLLOUT = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")


def test_routes_send_what_the_driver_holds_and_keep_what_a_later_worker_phase_reads():
    flow = Dataflow.of(
        (
            Phase("prompts", DRIVER, writes=("input_ids",)),
            Phase("gen", WORKER, reads=("input_ids",), writes=("input_ids", "responses", "sampled_log_probs")),
            Phase("reward", DRIVER, reads=("responses",), writes=("scores",)),
            Phase("update", WORKER, reads=("input_ids", "responses", "sampled_log_probs", "scores")),
        )
    )
    gen, update = flow.route("gen"), flow.route("update")
    assert (gen.send, gen.fetch, gen.give) == (("input_ids",), (), ("responses",))
    assert gen.keep == ("input_ids", "responses", "sampled_log_probs")
    # a new quantity (sampled_log_probs) is one edit: written by gen, read by update; it never reaches the driver
    assert (update.send, update.fetch, update.keep, update.give) == (
        ("scores",),
        ("input_ids", "responses", "sampled_log_probs"),
        (),
        (),
    )
    with pytest.raises(KeyError, match="no worker phase 'reward'"):
        flow.route("reward")


def test_a_read_that_no_earlier_phase_writes_is_refused():
    with pytest.raises(ValueError, match=r"phase 'update' reads \['advantages'\], which no earlier phase"):
        Dataflow.of((Phase("prompts", DRIVER, writes=("input_ids",)), Phase("update", WORKER, reads=("advantages",))))


def test_a_key_rewritten_on_the_driver_is_sent_again_not_fetched():
    flow = Dataflow.of(
        (
            Phase("prompts", DRIVER, writes=("x",)),
            Phase("a", WORKER, reads=("x",), writes=("y",)),
            Phase("fix", DRIVER, reads=("y",), writes=("y",)),
            Phase("b", WORKER, reads=("y",)),
        )
    )
    assert flow.route("a").keep == () and flow.route("a").give == ("y",) and flow.route("b").send == ("y",)


def test_the_plan_routes_the_demo_and_ppo_with_kl_in_the_reward():
    grpo = make_plan(load_config([]), 2).flows["step"]
    gen, update = grpo.route("gen"), grpo.route("update_actor")
    assert set(gen.keep) == set(ROLLOUT) and set(gen.give) == {"responses", "response_mask", "attention_mask"}
    assert update.send == ("advantages",) and set(update.fetch) == set(ROLLOUT)
    ppo = make_plan(
        load_config(
            [
                "algorithm.adv_estimator=gae",
                "algorithm.use_kl_in_reward=true",
                "actor_rollout_ref.actor.use_kl_loss=true",
                "actor_rollout_ref.actor.ppo_epochs=2",
            ]
        ),
        2,
    ).flows["step"]
    # the driver's KL penalty reads both log-probs and GAE the values: those come back, and stay for the updates
    for phase, key in (("old_log_prob", "old_log_probs"), ("ref", "ref_log_prob"), ("values", "values")):
        assert ppo.route(phase).keep == ppo.route(phase).give == (key,) and ppo.route(phase).send == ()
    assert ppo.route("update_critic").send == ("returns",)
    assert set(ppo.route("update_actor").fetch) == {*ROLLOUT, "old_log_probs", "ref_log_prob"}
    validation = make_plan(load_config([]), 2).flows["validation"].route("gen")
    assert validation.keep == () and set(validation.give) == {"responses", "response_mask", "attention_mask"}


def _call(route, token: str, rows: torch.Tensor, **tensors) -> DataProto:
    return DataProto.from_dict({ROWS: rows, **tensors}, meta_info={STEP: StepCall(token, route)})


def test_the_store_keeps_one_steps_rows_and_refuses_another_steps():
    flow = make_plan(load_config([]), 2).flows["step"]
    gen, update = flow.route("gen"), flow.route("update_actor")
    store, rows = StepStore(), torch.arange(4, 8)
    prompts = {k: torch.ones(4, 3, dtype=torch.long) for k in gen.send}
    produced = {k: torch.full((4, 5), i) for i, k in enumerate(ROLLOUT)}
    given = store.outputs(_call(gen, "t1", rows, **prompts), produced)
    assert set(given.batch) == set(gen.give) and set(store.tensors) == set(gen.keep)
    inputs = store.inputs(_call(update, "t1", rows, advantages=torch.zeros(4, 5)))
    assert set(inputs.batch) == set(update.reads)  # exactly the declared reads: no row index, nothing else
    assert torch.equal(inputs.batch["responses"], produced["responses"])
    with pytest.raises(StepStoreError, match="is for step t2, but this worker holds step t1"):
        store.inputs(_call(update, "t2", rows, advantages=torch.zeros(4, 5)))
    with pytest.raises(StepStoreError, match=r"is for rows 0\.\.3 \(4\), but this worker holds rows 4\.\.7 \(4\)"):
        store.inputs(_call(update, "t1", torch.arange(4), advantages=torch.zeros(4, 5)))
    store.outputs(_call(gen, "t2", rows, **prompts), produced)  # the next step's rollout replaces it
    assert store.token == "t2"
    with pytest.raises(StepStoreError, match="holds no step"):
        StepStore().inputs(_call(update, "t1", rows, advantages=torch.zeros(4, 5)))  # a restarted worker


def test_the_driver_sends_what_it_holds_of_the_reads_and_takes_back_what_was_given():
    gen = make_plan(load_config([]), 2).flows["step"].route("gen")
    prompts = {k: torch.ones(4, 3, dtype=torch.long) for k in gen.send}
    batch = DataProto.from_dict(
        {**prompts, "reward_baselines": torch.zeros(4)}, {"agent_name": ["tool_agent"] * 4, "data_source": ["x"] * 4}
    )
    call = request(batch, "t1", gen, {"temperature": 0.0})
    assert set(call.batch) == {ROWS, *gen.send} and torch.equal(call.batch[ROWS], torch.arange(4))
    assert set(call.non_tensor_batch) == {"agent_name"}  # the columns the rollout reads that the batch has
    assert call.meta_info[STEP] == StepCall("t1", gen) and call.meta_info["temperature"] == 0.0
    answer = DataProto.from_dict({k: torch.zeros(4, 5, dtype=torch.long) for k in gen.give})
    take_back(batch, gen, answer)
    # the prompt's input_ids and position_ids were rewritten on the workers: stale here, so gone
    assert set(batch.batch) == {"reward_baselines", *gen.give} and batch.batch["attention_mask"].shape == (4, 5)


def test_a_direct_call_carries_every_input_and_gets_every_output():
    store, data = StepStore(), DataProto.from_dict({"input_ids": torch.ones(2, 3)})
    assert store.inputs(data) is data
    out = store.outputs(data, {"a": torch.ones(2, requires_grad=True), "b": torch.zeros(2)})
    assert set(out.batch) == {"a", "b"} and not out.batch["a"].requires_grad and store.token is None


def test_the_old_log_probs_come_to_the_driver_only_for_the_sampled_tokens():
    """The run report (and trainer.rollout_data_dir) show each sampled token's log-prob: then the rollout's come
    back (ColoRL's loop: vLLM's log-probs are not the old ones)."""
    hf = "actor_rollout_ref.rollout.name=hf"
    on = make_plan(load_config([hf], config_name="smollm2_arith"), 1).flows["step"]
    assert "old_log_probs" in on.route("gen").give and on.phase("dump_rollout_generations").reads == ("old_log_probs",)
    off = make_plan(load_config([hf, "trainer.report.enable=false"], config_name="smollm2_arith"), 1).flows["step"]
    assert "old_log_probs" not in off.route("gen").give
    dumps = [hf, "trainer.report.enable=false", "trainer.rollout_data_dir=dumps"]
    assert (
        "old_log_probs" in make_plan(load_config(dumps, config_name="smollm2_arith"), 1).flows["step"].route("gen").give
    )
