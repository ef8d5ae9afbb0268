"""The killable pool a user's reward function runs in (data.reward_pool): a call past the deadline scores 0 as a
timeout and costs its worker only; raise and rubbish score 0 with their reason; hundreds of hangs leave no process,
thread or file descriptor behind."""

import os
import threading
import time

import pytest

from data.reward import failed, load_custom_compute_score
from data.reward_pool import CallRaised, CallTimeout, UserFunction, _pool

SOURCE = """
import math, time
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "hang":
        time.sleep(3600)
    if solution_str == "raise":
        raise ValueError("bad answer")
    if solution_str == "nan":
        return math.nan
    return float(solution_str == ground_truth)
"""


@pytest.fixture(scope="module")
def function(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward") / "hang_reward.py"
    path.write_text(SOURCE)
    loaded = load_custom_compute_score(str(path))
    assert isinstance(loaded, UserFunction)
    return loaded.bounded(0.5, 2)


def test_scores_raises_and_times_out(function):
    assert function("d", "a", "a") == 1.0 and function(data_source="d", solution_str="b", ground_truth="a") == 0.0
    with pytest.raises(CallRaised, match="ValueError: bad answer"):
        function("d", "raise", "a")
    start = time.monotonic()
    with pytest.raises(CallTimeout) as hang:
        function("d", "hang", "a")
    assert 0.5 <= time.monotonic() - start < 2.0
    assert failed("f", hang.value)[0] == "timeout" and function("d", "a", "a") == 1.0  # a fresh worker answers


def test_hundreds_of_hangs_leak_nothing(function):
    pool = _pool(function.path, function.name, function.processes)
    fds, threads = len(os.listdir("/proc/self/fd")), threading.active_count()
    before = set(_children())  # the test process's other children (Ray's, in a full run) are not the pool's
    quick = function.bounded(0.05, function.processes)
    for _ in range(100):
        with pytest.raises(CallTimeout):
            quick("d", "hang", "a")
    assert len(pool.idle) <= function.processes and threading.active_count() == threads
    assert len(os.listdir("/proc/self/fd")) <= fds + 2 * function.processes
    children = sorted(set(_children()) - before)
    assert len(children) <= function.processes, children


def _parent(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1


def _children() -> list[str]:
    """The pids of this process's children."""
    return [p for p in os.listdir("/proc") if p.isdigit() and _parent(p) == os.getpid()]


BATCH_SOURCE = """
import time
def compute_score(data_sources, solution_strs, ground_truths, extra_infos):
    if "3" in solution_strs:
        time.sleep(3600)
    return [float(s == g) for s, g in zip(solution_strs, ground_truths)]
"""


def test_a_hang_in_a_batch_call_costs_one_response(tmp_path, char_tokenizer):
    """The batch manager makes a timed-out batch call again one response at a time: the response it hangs on
    scores 0 as a timeout, the others keep their scores, and the step goes on (no RewardError)."""
    from data.reward import BatchRewardManager
    from tests.data.test_data_reward import _batch

    path = tmp_path / "batch_reward.py"
    path.write_text(BATCH_SOURCE)
    manager = BatchRewardManager(char_tokenizer, load_custom_compute_score(str(path)).bounded(0.5, 1))
    reward, _ = manager(_batch(char_tokenizer, ["1$", "3$", "2$", "5$"], ["1", "1", "2", "2"]))
    assert reward.sum(-1).tolist() == [1.0, 0.0, 1.0, 0.0]
    assert manager.last_errors == 1 and manager.last_error_reasons == {"timeout": 1}


def test_a_batch_of_calls_answers_each_in_order_within_its_deadline(function):
    """``map``: one round trip per worker; a hang ends its worker and the calls after it still answer."""
    calls = [{"data_source": "d", "solution_str": s, "ground_truth": "a"} for s in ["a", "hang", "b", "raise", "a"]]
    start = time.monotonic()
    values = function.map(calls * 2)
    assert time.monotonic() - start < 4 * function.timeout  # two hangs, each within its deadline
    kinds = [type(v).__name__ if isinstance(v, Exception) else v for v in values]
    assert kinds == [1.0, "CallTimeout", 0.0, "CallRaised", 1.0] * 2
