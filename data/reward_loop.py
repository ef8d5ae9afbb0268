"""The reward loop: the reward managers by name, the two that score responses concurrently, in the background, and
a user's manager class (``source=importlib``, ``ImportedRewardManager``), scored the same way.

``rate_limited`` calls the user's ``compute_score`` (async, or sync in a thread) at most ``reward.max_concurrent``
at a time, under token buckets (``reward.max_rpm`` requests and ``reward.max_tpm`` ≈ tokens a minute, each
request counted as ``reward.estimated_tokens_per_request``); ``remote`` calls a sync one in ``reward.num_workers``
Ray actors beside the trainer, one call each at a time. Both start scoring at ``submit`` on an event loop of their
own (a thread), so the driver goes on with the step until it needs the scores; each call ends after
``reward.timeout`` seconds: that response scores 0, counted as ``reward/errors/timeout``; a remote worker that
timed out is replaced (its call may never return).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import numpy as np

from config import ConfigError
from data.reward import (
    BatchRewardManager,
    DAPORewardManager,
    GDPORewardManager,
    RewardHandle,
    RewardManager,
    Scored,
    checked,
    failed,
    import_file,
)
from data.reward_pool import UserFunction
from single_controller.data_proto import DataProto


class TokenBucket:
    """A token bucket: ``rate`` tokens a second, holding at most ``rate`` (one second's worth), full at first.
    ``acquire(n)`` waits until n tokens are there and takes them; more than the bucket holds goes into debt."""

    def __init__(self, rate: float) -> None:
        self.rate, self.capacity, self.tokens = rate, rate, rate
        self.last: float | None = None
        self.lock = asyncio.Lock()

    async def acquire(self, n: float = 1.0) -> None:
        while True:
            async with self.lock:
                now = asyncio.get_running_loop().time()
                # tokens = min(capacity, tokens + elapsed · rate)
                self.tokens = min(self.capacity, self.tokens + (now - (self.last or now)) * self.rate)
                self.last = now
                if n > self.capacity:  # more than it ever holds: taken now, the deficit waited for once
                    wait, self.tokens = max(0.0, (n - self.tokens) / self.rate), self.tokens - n
                elif self.tokens >= n:
                    self.tokens -= n
                    return
                else:
                    wait = (n - self.tokens) / self.rate
            await asyncio.sleep(wait)
            if n > self.capacity:
                return


class _Loop:
    """An event loop in a daemon thread, a thread pool for sync functions (threads a hung call holds stay held),
    and the limits made on it: the semaphore and the token buckets (rpm/60 requests, tpm/60 tokens a second)."""

    def __init__(self, max_concurrent: int, max_rpm: int | None, max_tpm: int | None) -> None:
        self.loop = asyncio.new_event_loop()
        self.pool = ThreadPoolExecutor(max(32, 4 * max_concurrent), thread_name_prefix="colorl-reward")
        threading.Thread(target=self.loop.run_forever, name="colorl-reward-loop", daemon=True).start()
        self.limits = self.run(_limits(max_concurrent, max_rpm, max_tpm))()

    def run(self, coroutine: Any) -> Callable[[], Any]:
        """Start ``coroutine`` on the loop; a function that waits for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result


class ConcurrentRewardManager(RewardManager):
    """The "rate_limited" manager: each response's call under the limits above, in the background."""

    def __init__(
        self,
        *args: Any,
        max_concurrent: int = 1,
        timeout: float = 300.0,
        max_rpm: int | None = None,
        max_tpm: int | None = None,
        estimated_tokens_per_request: int = 2000,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.max_concurrent, self.timeout, self.tokens_per_request = (
            max_concurrent,
            timeout,
            estimated_tokens_per_request,
        )
        self.is_async = inspect.iscoroutinefunction(self.compute_score)
        self._loop = _shared_loop(max_concurrent, max_rpm, max_tpm)

    def _start(self, sources: list, solutions: list[str], truths: list, infos: list[dict]) -> Callable[[], list]:
        calls = [dict(data_source=s, solution_str=r, ground_truth=t, extra_info=i) for s, r, t, i in
                 zip(sources, solutions, truths, infos)]  # fmt: skip
        return self._loop.run(self._gather(calls))

    async def _gather(self, calls: list[dict]) -> list[Scored]:
        return list(await asyncio.gather(*(self._limited(call) for call in calls)))

    async def _limited(self, call: dict, here: bool = False) -> Scored:
        """One response's score under the token buckets, then the concurrency limit and the timeout (``here``: in
        this process, whatever the manager)."""
        semaphore, rpm, tpm = self._loop.limits
        if rpm is not None:
            await rpm.acquire(1.0)
        if tpm is not None:
            await tpm.acquire(self.tokens_per_request)
        async with semaphore:
            return await self._guarded(ConcurrentRewardManager._call(self, call) if here else self._call(call))

    async def _guarded(self, call: Awaitable[Any]) -> Scored:
        """The result of ``call`` (one response's score) within the timeout, or its failure."""
        try:
            result = await asyncio.wait_for(call, self.timeout)
        except asyncio.TimeoutError:
            return {"score": 0.0}, ("timeout", f"reward function {self.name!r} timed out after {self.timeout}s")
        except _ray_task_error() as exc:  # a remote worker's: the traceback's last line, the function's
            return {"score": 0.0}, ("raised", f"reward function {self.name!r} raised {str(exc).split(chr(10))[-1]}")
        except Exception as exc:
            return {"score": 0.0}, failed(self.name, exc)
        return checked(result, self.name)

    async def _call(self, call: dict) -> Any:
        """The user's function on one response: awaited when async, else in a thread of the pool."""
        if self.is_async:
            return await self.compute_score(**call)
        return await asyncio.get_running_loop().run_in_executor(
            self._loop.pool, functools.partial(self.compute_score, **call)
        )

    def probe(self, row: dict[str, Any], key: str) -> None:
        """As ``RewardManager.probe``, through the limits and the timeout: a judge that is down or slow is left to
        the run; a result that is no score is a ``ConfigError`` on ``key``. Called before Ray runs: in this
        process."""
        call = dict(
            data_source=row[self.reward_fn_key],
            solution_str="",
            ground_truth=(row["reward_model"] or {}).get("ground_truth"),
            extra_info={**(row["extra_info"] or {}), "stopped_by_eos": True},
        )
        _, failure = self._loop.run(self._limited(call, here=True))()
        if failure is not None and failure[0] == "invalid":
            raise ConfigError.invalid(key, self.name, f"{failure[1]} for the first prompt (with an empty response)")


@functools.cache
def _shared_loop(max_concurrent: int, max_rpm: int | None, max_tpm: int | None) -> _Loop:
    """One loop and one set of limits for the managers of a process with the same limits (the limits are
    global: training's and validation's managers share them)."""
    return _Loop(max_concurrent, max_rpm, max_tpm)


async def _limits(max_concurrent: int, max_rpm: int | None, max_tpm: int | None) -> tuple:
    return (
        asyncio.Semaphore(max_concurrent),
        None if max_rpm is None else TokenBucket(max_rpm / 60.0),
        None if max_tpm is None else TokenBucket(max_tpm / 60.0),
    )


class RewardComputeWorker:
    """Calls the user's sync ``compute_score`` in its own process (the function need not be thread-safe)."""

    def __init__(self, compute_score_fn: Callable[..., Any]) -> None:  # here, not in a pool: the actor is killable
        local = isinstance(compute_score_fn, UserFunction)
        self.compute_score_fn = compute_score_fn.local() if local else compute_score_fn

    def compute_score(self, **kwargs: Any) -> Any:
        return self.compute_score_fn(**kwargs)

    def ready(self) -> bool:
        return True


def _ray_task_error() -> tuple[type[BaseException], ...]:
    """Ray's error of a remote call, where Ray is imported (the remote manager's runs); else nothing to catch."""
    ray = sys.modules.get("ray")
    return (ray.exceptions.RayTaskError,) if ray is not None else ()


class RemoteRewardManager(ConcurrentRewardManager):
    """The "remote" manager: ``num_workers`` Ray actors, each scoring one response at a time; created at the
    first batch (Ray runs by then). A worker whose call timed out is killed and replaced."""

    def __init__(self, *args: Any, num_workers: int = 8, **kwargs: Any) -> None:
        super().__init__(*args, max_concurrent=num_workers, **kwargs)
        if self.is_async:
            raise ConfigError.invalid(
                "reward.reward_manager.name", "remote", f"{self.name!r} is async: score it with rate_limited"
            )
        self._idle: asyncio.Queue | None = None
        self._starting: set[asyncio.Task] = set()  # replacements starting (held: the loop keeps weak references)

    async def _gather(self, calls: list[dict]) -> list[Scored]:
        if self._idle is None:  # the workers start (outside the calls' timeout): one idle worker for each call
            self._idle = asyncio.Queue()
            await asyncio.gather(*(self._ready(self._spawn()) for _ in range(self.max_concurrent)))
        return await super()._gather(calls)

    def _spawn(self) -> Any:
        import ray

        # num_cpus=0: beside workers that hold every CPU slot (trainer.running.run), a slot each would never schedule
        return ray.remote(num_cpus=0)(RewardComputeWorker).remote(self.compute_score)

    async def _ready(self, worker: Any) -> None:
        """Put ``worker`` among the idle ones once it has started."""
        await asyncio.wrap_future(worker.ready.remote().future())
        self._idle.put_nowait(worker)

    async def _call(self, call: dict) -> Any:
        worker = await self._idle.get()  # the semaphore keeps the calls to num_workers: one is idle
        try:
            result = await asyncio.wrap_future(worker.compute_score.remote(**call).future())
        except BaseException:  # timed out (cancelled) or died: a fresh worker takes its place once started
            sys.modules["ray"].kill(worker)
            task = asyncio.get_running_loop().create_task(self._ready(self._spawn()))
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)
            raise
        self._idle.put_nowait(worker)
        return result


class ImportedRewardManager(ConcurrentRewardManager):
    """``reward.reward_manager.source=importlib``: the user's reward-manager class, built as
    ``cls(config=, tokenizer=, compute_score=)`` on the reward loop (a manager's ``get_event_loop()`` is the loop
    that runs it). Each response is scored by its ``async run_single(data)`` on a one-row batch (``UserRows``:
    ``data[0]`` is the row itself), all at once, gathered, each within ``reward.timeout``; it returns
    ``{"reward_score": float, "reward_extra_info": dict}`` (the interface: docs/algorithms.md)."""

    def __init__(self, *args: Any, manager_cls: type, config: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.manager_name, self._rows = manager_cls.__name__, []
        self.manager = self._loop.run(_built(manager_cls, config, self.tokenizer, self.compute_score))()

    @property
    def name(self) -> str:
        return self.manager_name

    def probe(self, row: dict[str, Any], key: str) -> None:
        """Nothing to try before the run: the class was built (``make_reward_manager``); its scores are the run's."""

    def submit(self, data: Any) -> RewardHandle:
        rows = UserRows(batch=data.batch, non_tensor_batch=data.non_tensor_batch, meta_info=data.meta_info)
        self._rows = [rows[i : i + 1] for i in range(len(rows))]
        return super().submit(data)

    def _start(self, sources: list, solutions: list[str], truths: list, infos: list[dict]) -> Callable[[], list]:
        rows, self._rows = self._rows, []
        for row, info in zip(rows, infos):  # with ColoRL's additions (stopped_by_eos, num_turns, ...): the row's own
            row.non_tensor_batch["extra_info"] = np.empty(1, dtype=object)
            row.non_tensor_batch["extra_info"][0] = info
        return self._loop.run(self._gather(rows))

    async def _gather(self, rows: list) -> list[Scored]:
        return list(await asyncio.gather(*(self._guarded(self._run_single(row)) for row in rows)))

    async def _run_single(self, row: Any) -> Any:
        result = await self.manager.run_single(row)
        if not (isinstance(result, dict) and "reward_score" in result):
            return result  # a number is a score; anything else is counted invalid
        return {**(result.get("reward_extra_info") or {}), "score": result["reward_score"]}


class UserRows(DataProto):
    """Rows as a user's manager reads them: ``data[i]`` (an int) is row i itself, each tensor one dimension less and
    each column its value, with the batch's ``meta_info``; any other selection is the core's, of this class."""

    def __getitem__(self, item: Any) -> Any:
        if not isinstance(item, (int, np.integer)):
            return super().__getitem__(item)
        row = super().__getitem__(item)  # one row, range-checked
        batch = None if row.batch is None else {key: value[0] for key, value in row.batch.items()}
        columns = {key: value[0] for key, value in row.non_tensor_batch.items()}
        return SimpleNamespace(batch=batch, non_tensor_batch=columns, meta_info=row.meta_info)


async def _built(cls: type, config: Any, tokenizer: Any, compute_score: Any) -> Any:
    return cls(config=config, tokenizer=tokenizer, compute_score=compute_score)


def load_manager_class(path: str, name: str) -> type:
    """Class ``name`` of ``reward_manager.module.path``: ``pkg://a.b.c`` (an importable module) or a Python file
    (with or without ``file://``). FileNotFoundError, AttributeError, or what importing raised."""
    if path.startswith("pkg://"):
        module = importlib.import_module(path.removeprefix("pkg://").replace("/", "."))
    else:
        file = path.removeprefix("file://")
        if not os.path.isfile(file):
            raise FileNotFoundError(file)
        module = import_file(file)
    cls = getattr(module, name, None)
    if not (isinstance(cls, type) and inspect.iscoroutinefunction(getattr(cls, "run_single", None))):
        raise AttributeError(f"{path} has no class {name!r} with an async run_single(data) (a reward manager's)")
    return cls


# the reward managers by name (reward.reward_manager.name): "prime" scores each response as "naive" does (in a
# process pool with a timeout, as every manager here calls a user's function: data.reward_pool)
REWARD_MANAGERS: dict[str, type[RewardManager]] = {
    "naive": RewardManager,
    "prime": RewardManager,
    "batch": BatchRewardManager,
    "dapo": DAPORewardManager,
    "gdpo": GDPORewardManager,
    "rate_limited": ConcurrentRewardManager,
    "remote": RemoteRewardManager,
}
