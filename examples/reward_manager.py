"""A reward-manager class, for ``reward.reward_manager.source=importlib`` (the interface of docs/algorithms.md:
the class is built with the config, the tokenizer and the reward function, and scores one response at a
time with ``async run_single``). It scores as the naive manager does, and adds each response's length::

    python main.py reward.reward_manager.source=importlib \\
        reward.reward_manager.module.path=examples/reward_manager.py reward.reward_manager.name=LengthAwareRewardManager

ColoRL calls ``run_single`` on every response of a batch at once, each within ``reward.timeout`` seconds; a call
that raises, times out or returns no score scores that response 0 (``reward/errors``). ``data`` is a one-row
DataProto whose ``data[0]`` is the row (each tensor one dimension less), its ``non_tensor_batch`` the row's
``data_source``, ``reward_model`` and ``extra_info`` (with ColoRL's ``stopped_by_eos``: the built-in tasks' rewards
read it).
"""

import asyncio
import inspect


class LengthAwareRewardManager:
    def __init__(self, config, tokenizer, compute_score, **kwargs):
        self.tokenizer, self.compute_score = tokenizer, compute_score
        self.response_limit = config.data.max_response_length
        # the loop run_single runs on, taken at construction as the interface's base class takes it
        self.loop = asyncio.get_event_loop()

    async def run_single(self, data):
        item = data[0]
        response_ids = item.batch["responses"]
        # the response's tokens: the attention mask's part after the prompt (tool turns included)
        length = int(item.batch["attention_mask"][-response_ids.shape[-1] :].sum())
        text = self.tokenizer.decode(response_ids[:length], skip_special_tokens=True)
        call = dict(
            data_source=item.non_tensor_batch["data_source"],
            solution_str=text,
            ground_truth=item.non_tensor_batch["reward_model"]["ground_truth"],
            extra_info=item.non_tensor_batch["extra_info"],
        )
        if inspect.iscoroutinefunction(self.compute_score):
            result = await self.compute_score(**call)
        else:  # a sync function (a rule, a blocking client) in a thread: the other responses' calls go on
            result = await self.loop.run_in_executor(None, lambda: self.compute_score(**call))
        score = result["score"] if isinstance(result, dict) else result
        return {
            "reward_score": score,
            "reward_extra_info": {"acc": score, "response_fraction": length / self.response_limit},
        }
