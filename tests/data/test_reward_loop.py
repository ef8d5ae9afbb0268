"""verl's concurrent reward managers (rate_limited, remote) and gdpo against a real judge over HTTP on loopback:
it answers after a delay, with an error status, with nonsense or never. No mock of the HTTP client."""

import asyncio
import functools
import time

import aiohttp  # noqa: F401 - imported before the clock starts, as a run's first step would have it
import pytest
import torch

from benchmarks.judge import URL_VAR, async_judge_score, judge_score, serve
from data.reward import GDPORewardManager, RewardError
from data.reward_loop import ConcurrentRewardManager, RemoteRewardManager, TokenBucket
from data.tasks import default_compute_score
from single_controller import DataProto

DELAY = 0.2


def _batch(tok, answers: list[str]) -> DataProto:
    """Reversal answers ("colorl/reverse" of "12"), one row each; the judge's fate rides in the ground truth."""
    width = max(map(len, answers)) + 1
    ids = torch.full((len(answers), width), tok.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, text in enumerate(answers):
        row = [tok.convert_tokens_to_ids(t) for t in text] + [tok.eos_token_id]
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
    return DataProto.from_dict(
        {"responses": ids, "response_mask": mask},
        {
            "data_source": ["colorl/reverse"] * len(answers),
            "reward_model": [{"ground_truth": "21"} for _ in answers],
            "extra_info": [{"index": i} for i in range(len(answers))],
        },
    )


FATES = {"ok": "21", "error": "2", "hang": "1", "nonsense": "11"}  # the answer a row gives -> what the judge does


@pytest.fixture(scope="module")
def judge():
    fate_of = {answer: fate for fate, answer in FATES.items()}
    server, url = serve(DELAY, lambda body: fate_of.get(body["solution_str"], "ok"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(URL_VAR, url)
        yield url
    server.shutdown()


def _rate_limited(tok, function, **kwargs):
    return ConcurrentRewardManager(tok, compute_score=function, **{"max_concurrent": 8, **kwargs})


@pytest.mark.parametrize("function", [judge_score, async_judge_score], ids=["sync", "async"])
def test_rate_limited_scores_8_at_a_time_and_survives_errors_nonsense_and_a_hang(char_tokenizer, judge, function):
    answers = ["21"] * 13 + ["12", "2", "1", "11"]  # 14 answered (13 right, 1 reversed), an error, a hang, nonsense
    manager = _rate_limited(char_tokenizer, function, timeout=4 * DELAY)
    started = time.perf_counter()
    handle = manager.submit(_batch(char_tokenizer, answers))  # returns at once: the judge works in the background
    submitted = time.perf_counter() - started
    reward, extras = handle.result()
    wall = time.perf_counter() - started
    assert submitted < DELAY
    assert extras["score"] == [1.0] * 13 + [default_compute_score("colorl/reverse", "12", "21")] + [0.0] * 3
    assert reward.sum(-1).tolist() == pytest.approx(extras["score"]) and reward[0, 2].item() == 1.0  # on the eos
    assert manager.last_errors == 3
    assert manager.last_error_reasons == {"raised": 1, "timeout": 1, "invalid": 1}
    serial = len(answers) * DELAY
    assert wall < serial / 2  # 17 calls 8 at a time: about the hang's timeout (0.8 s) after its start (0.2 s)


def test_rate_limited_is_as_fast_as_the_limits_allow(char_tokenizer, judge):
    answers = ["21"] * 16
    for concurrent, rounds in ((8, 2), (2, 8)):
        manager = _rate_limited(char_tokenizer, async_judge_score, max_concurrent=concurrent)
        started = time.perf_counter()
        manager(_batch(char_tokenizer, answers))
        wall = time.perf_counter() - started
        assert rounds * DELAY <= wall < rounds * DELAY + 0.5 * (rounds + 1) * DELAY
    limited = _rate_limited(char_tokenizer, async_judge_score, max_concurrent=8, max_rpm=600)  # 10 a second
    started = time.perf_counter()
    limited(_batch(char_tokenizer, answers))  # the bucket holds 10: 6 more wait 0.1 s each
    assert time.perf_counter() - started >= 0.5


def test_token_bucket_keeps_verls_rate():
    async def take(bucket, n, each):
        started = asyncio.get_running_loop().time()
        for _ in range(n):
            await bucket.acquire(each)
        return asyncio.get_running_loop().time() - started

    assert asyncio.run(take(TokenBucket(100.0), 100, 1.0)) < 0.1  # a full second's worth at once
    assert 0.45 < asyncio.run(take(TokenBucket(100.0), 150, 1.0)) < 0.8  # then 100 a second
    assert 1.9 < asyncio.run(take(TokenBucket(100.0), 2, 150.0)) < 2.4  # over capacity: each waits its deficit


def test_a_judge_down_for_the_whole_batch_is_one_error(char_tokenizer, judge):
    manager = _rate_limited(char_tokenizer, judge_score)
    with pytest.raises(RewardError, match=r"raised HTTPError: HTTP Error 500: judge overloaded.*all 3 responses"):
        manager(_batch(char_tokenizer, ["2"] * 3))


@pytest.mark.slow  # a minute of Ray runs: make test keeps under its 20 minutes
def test_remote_scores_in_ray_workers_and_replaces_a_hung_one(ray_cluster, char_tokenizer, judge):
    function = functools.partial(judge_score, url=judge)  # the cluster's workers started before the URL was set
    manager = RemoteRewardManager(char_tokenizer, compute_score=function, num_workers=8, timeout=1.0)
    manager(_batch(char_tokenizer, ["21"]))  # the workers start
    answers = ["21"] * 14 + ["2", "1"]
    started = time.perf_counter()
    reward, extras = manager(_batch(char_tokenizer, answers))
    wall = time.perf_counter() - started
    assert extras["score"] == [1.0] * 14 + [0.0] * 2
    assert manager.last_error_reasons == {"raised": 1, "timeout": 1}
    assert wall < len(answers) * DELAY  # two rounds, and the hang's timeout: not the serial sum
    _, extras = manager(_batch(char_tokenizer, ["21"] * 8))  # the hung worker was replaced: 8 answer again
    assert extras["score"] == [1.0] * 8 and manager.last_errors == 0


def test_remote_refuses_an_async_function(char_tokenizer):
    from config import ConfigError

    with pytest.raises(ConfigError, match="rate_limited"):
        RemoteRewardManager(char_tokenizer, compute_score=async_judge_score, num_workers=2)


def test_gdpo_gives_the_dict_per_key_with_the_experiment_name(char_tokenizer):
    seen = []

    def score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(extra_info["experiment_name"])
        return {"score": 1.0, "accuracy_reward": float(solution_str == ground_truth), "format_reward": 0.5}

    manager = GDPORewardManager(char_tokenizer, compute_score=score, experiment_name="exp")
    _, extras = manager(_batch(char_tokenizer, ["21", "12"]))
    assert extras == {"score": [1.0, 1.0], "accuracy_reward": [1.0, 0.0], "format_reward": [0.5, 0.5]}
    assert seen == ["exp", "exp"]


def test_config_builds_verls_reward_loop_managers_from_its_keys(char_tokenizer):
    from planner import load_config
    from trainer.running.build import make_reward_manager

    def build(*overrides):
        return make_reward_manager(load_config(list(overrides)), char_tokenizer, judge_score)

    gdpo = build("reward.reward_manager.name=gdpo", "trainer.experiment_name=exp")
    assert isinstance(gdpo, GDPORewardManager) and gdpo.experiment_name == "exp"
    limited = build("reward.reward_manager.name=rate_limited", "+reward.max_concurrent=8", "+reward.max_rpm=600")
    assert (type(limited), limited.max_concurrent, limited.timeout) == (ConcurrentRewardManager, 8, 300.0)
    assert limited._loop.limits[1].rate == 10.0 and limited._loop.limits[2] is None  # 600 a minute: 10 a second
    remote = build("reward.reward_manager.name=remote", "reward.num_workers=3", "+reward.timeout=5")
    assert (type(remote), remote.max_concurrent, remote.timeout) == (RemoteRewardManager, 3, 5.0)
