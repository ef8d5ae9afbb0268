"""Rule-based reward: decode each response, score it, put the score on its last valid token."""

from __future__ import annotations

import importlib.util
import inspect
import math
import numbers
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from config import ConfigError
from data.reward_pool import CallRaised, UserFunction
from data.tasks import default_compute_score
from single_controller.data_proto import DataProto

ComputeScore = Callable[..., "float | dict[str, Any]"]
Failure = tuple[str, str]  # why a response scored 0 (reward/errors/<reason>: raised, invalid, timeout) and its line
Scored = tuple[dict[str, Any], "Failure | None"]  # a response's result (with "score") and its failure, if any


VALID_RESULT = "a reward function must return a number, or a dict with a numeric 'score' (and any other values)"


class RewardError(ValueError):
    """A reward function failed on a response; the message names the function, the row and the response."""


class RewardHandle:
    """A batch being scored (``RewardManager.submit``): ``result()`` waits for its scores, once."""

    def __init__(self, finish: Callable[[], tuple[torch.Tensor, dict[str, list[Any]]]]) -> None:
        self._finish, self._result = finish, None

    def result(self) -> tuple[torch.Tensor, dict[str, list[Any]]]:
        if self._result is None:
            self._result = self._finish()
        return self._result


class RewardManager:
    """Turns a rollout batch into token-level scores (``reward.reward_manager.name=naive``).

    For row i with n valid response tokens, ``reward_tensor[i, n - 1] = compute_score(...)`` and 0 elsewhere.
    The response is decoded without special tokens; ``extra_info["stopped_by_eos"]`` tells the score whether
    the last valid token was an eos (True) or generation hit the length limit (False).

    A multi-turn rollout's response holds tool turns too: the valid tokens are those of the attention mask,
    the whole conversation after the prompt is decoded, the tools' step rewards (``tool_rewards``)
    add to the score, and ``extra_info`` gets ``num_turns`` and ``rollout_reward_scores`` (each tool's
    ``calc_reward``).
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        compute_score: ComputeScore | None = None,
        reward_fn_key: str = "data_source",
        eos_token_id: int | list[int] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key
        eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
        self.eos_token_ids = set(eos) if isinstance(eos, (list, tuple, set)) else {eos}
        self.last_errors = 0  # responses of the last batch that the function failed on (scored 0)
        self.last_error_reasons: dict[str, int] = {}  # those by reason (Failure)
        self.last_error_rows: list[int] = []  # and their rows (the run's ledger counts their prompts as failed)

    @property
    def name(self) -> str:
        return getattr(self.compute_score, "__name__", repr(self.compute_score))

    def probe(self, row: dict[str, Any], key: str) -> None:
        """Call the function once on dataset ``row`` with an empty response, before any model loads: a result that
        is no score is a ``ConfigError`` on ``key``. An exception is left to the run: a real response may not raise."""
        try:
            result = self.compute_score(
                data_source=row[self.reward_fn_key],
                solution_str="",
                ground_truth=(row["reward_model"] or {}).get("ground_truth"),
                extra_info={**(row["extra_info"] or {}), "stopped_by_eos": True},
            )
        except Exception:
            return
        if score_of(result) is None:
            raise ConfigError.invalid(
                key, self.name, f"returned {result!r:.80} for the first prompt (with an empty response); {VALID_RESULT}"
            )

    def __call__(self, data: DataProto) -> tuple[torch.Tensor, dict[str, list[Any]]]:
        """Score a batch and wait for it: ``submit(data).result()``."""
        return self.submit(data).result()

    def submit(self, data: DataProto) -> RewardHandle:
        """Start scoring a batch; the handle's ``result()`` gives what ``__call__`` returns.

        Reads ``batch["responses"]`` (B, R), ``batch["response_mask"]`` (B, R) and the non-tensors
        ``reward_fn_key``, ``reward_model`` (with ``ground_truth``) and ``extra_info`` now (the batch may change
        after); the responses are scored now here, in the background by a concurrent manager (``data.reward_loop``).
        The result is ``reward_tensor`` (B, R) float32 and extra per-row lists: ``score`` plus any other keys a
        ``compute_score`` returning a dict gives. A response on which the function raises, times out or returns no
        finite score scores 0 (counted in ``last_errors``, by reason in ``last_error_reasons``, by row in
        ``last_error_rows``, with a warning line naming the function, the row and the error); the run goes on.
        Failing on every response of a batch is a broken function (or a judge that is down): ``RewardError``.
        """
        responses = data.batch["responses"]
        valid = data.batch["attention_mask"][:, -responses.shape[-1] :] if "attention_mask" in data.batch else None
        lengths = (data.batch["response_mask"] if valid is None else valid).sum(-1).tolist()
        rollout = {key: data.non_tensor_batch.get(key) for key in ("tool_rewards", "__num_turns__", "reward_scores")}
        sources = list(data.non_tensor_batch[self.reward_fn_key])
        extra_infos = data.non_tensor_batch.get("extra_info")
        rows = [row[: int(length)] for row, length in zip(responses.tolist(), lengths)]
        solutions = self.tokenizer.batch_decode(rows, skip_special_tokens=True)  # one call, not one per row
        infos = []
        for i, ids in enumerate(rows):
            extra_info = dict(extra_infos[i] or {}) if extra_infos is not None else {}
            extra_info["stopped_by_eos"] = bool(ids) and ids[-1] in self.eos_token_ids
            if (
                rollout["__num_turns__"] is not None
            ):  # the names a reward function reads for what the multi-turn rollout did
                extra_info.update(
                    num_turns=rollout["__num_turns__"][i], rollout_reward_scores=rollout["reward_scores"][i]
                )
            infos.append(extra_info)
        truths = [reward_model["ground_truth"] for reward_model in data.non_tensor_batch["reward_model"]]
        pending = self._start(sources, solutions, truths, infos)
        tools = rollout["tool_rewards"]
        shape = tuple(responses.shape)
        return RewardHandle(lambda: self._assemble(shape, rows, sources, solutions, tools, pending()))

    def _start(self, sources: list, solutions: list[str], truths: list, infos: list[dict]) -> Callable[[], list]:
        """Start scoring the responses; a function that waits for each one's ``(result, failure)``."""
        scored = self._score_all(sources, solutions, truths, infos)
        return lambda: scored

    def _assemble(
        self, shape: tuple, rows: list, sources: list, solutions: list[str], tools: Any, scored: list
    ) -> tuple[torch.Tensor, dict[str, list[Any]]]:
        """The reward tensor and per-row extras from each response's ``(result, failure)`` (``submit``)."""
        reward_tensor = torch.zeros(shape, dtype=torch.float32)
        results: list[dict[str, Any]] = []
        errors: list[str] = []
        reasons: dict[str, int] = {}
        failed: list[int] = []
        for i, (ids, solution, (result, failure)) in enumerate(zip(rows, solutions, scored)):
            reward, shaping = self.shape(result["score"], len(ids))
            result.update(shaping)
            if failure is not None:  # this trajectory scores 0; the others keep theirs
                reason, line = failure
                reasons[reason] = reasons.get(reason, 0) + 1
                failed.append(i)
                errors.append(f"{line} (row {i}, data_source={sources[i]!r}, response={solution!r:.200})")
            results.append(result)
            tool_reward = float(tools[i]) if tools is not None else 0.0
            if ids:  # an empty response has no token to carry its score
                reward_tensor[i, len(ids) - 1] = reward + tool_reward
        self.last_errors, self.last_error_reasons, self.last_error_rows = len(errors), reasons, failed
        if errors and len(errors) == len(rows):  # failing on every response is a broken function, not a response
            raise RewardError(f"{errors[0]}; it failed on all {len(rows)} responses of the batch")
        if errors:
            print(
                f"colorl: warning: {errors[0]}; scored 0, as {len(errors)} of {len(rows)} responses "
                f"(reward/errors in the metrics)",
                file=sys.stderr,
                flush=True,
            )
        keys = dict.fromkeys(k for result in results for k in result)
        extras = {k: [result.get(k, 0.0) for result in results] for k in keys}
        return reward_tensor, extras

    def shape(self, score: float, length: int) -> tuple[float, dict[str, Any]]:
        """The reward of a response of ``length`` tokens that scored ``score``, and values to record beside the
        score: the score itself and nothing here (a manager that shapes rewards overrides this)."""
        return score, {}

    def _score_all(self, sources: list, solutions: list[str], truths: list, infos: list[dict]) -> list[Scored]:
        """Each response's ``(result, failure)``: the function called once per response (the naive manager); a
        user's function in its pool, the batch's calls in one round trip (``UserFunction.map``)."""
        if not isinstance(self.compute_score, UserFunction):
            return [self._score(*args) for args in zip(sources, solutions, truths, infos)]
        calls = [
            {"data_source": source, "solution_str": solution, "ground_truth": truth, "extra_info": info}
            for source, solution, truth, info in zip(sources, solutions, truths, infos)
        ]
        outcomes = self.compute_score.map(calls)
        return [
            ({"score": 0.0}, failed(self.name, out)) if isinstance(out, Exception) else checked(out, self.name)
            for out in outcomes
        ]

    def _score(self, data_source: Any, solution: str, ground_truth: Any, extra_info: dict) -> Scored:
        """The user's function on one response, as a dict with ``score`` (0 on failure) and the failure, if it
        raised or returned no finite score."""
        try:
            result = self.compute_score(
                data_source=data_source, solution_str=solution, ground_truth=ground_truth, extra_info=extra_info
            )
        except Exception as exc:
            return {"score": 0.0}, failed(self.name, exc)
        return checked(result, self.name)


class BatchRewardManager(RewardManager):
    """The "batch" reward manager: the function is called once per batch with lists (``data_sources``,
    ``solution_strs``, ``ground_truths``, ``extra_infos``) and returns one result per response.

    A batch call past ``reward.timeout`` is made again one response at a time, each call within the timeout: a
    response the function hangs on scores 0 (``reward/errors/timeout``) and the others keep their scores, so a hang
    costs its trajectory, not the batch."""

    def _score_all(self, sources: list, solutions: list[str], truths: list, infos: list[dict]) -> list[Scored]:
        try:
            results = list(
                self.compute_score(
                    data_sources=sources, solution_strs=solutions, ground_truths=truths, extra_infos=infos
                )
            )
        except TimeoutError as exc:
            if len(infos) == 1:
                return [({"score": 0.0}, failed(self.name, exc))]
            rows = zip(sources, solutions, truths, infos)
            return [scored for row in rows for scored in self._score_all(*([value] for value in row))]
        except Exception as exc:  # the whole batch's scores are lost: each response scores 0
            return [({"score": 0.0}, failed(self.name, exc))] * len(infos)
        if len(results) != len(infos):
            error = (
                "invalid",
                f"reward function {self.name!r} returned {len(results)} results for {len(infos)} responses",
            )
            return [({"score": 0.0}, error)] * len(infos)
        return [checked(result, self.name) for result in results]

    def probe(self, row: dict[str, Any], key: str) -> None:
        """As ``RewardManager.probe``, with the batch function's list arguments (one row)."""
        single = RewardManager.__new__(RewardManager)
        single.__dict__.update(self.__dict__)
        single.compute_score = lambda **kw: self.compute_score(**{f"{k}s": [v] for k, v in kw.items()})[0]
        RewardManager.probe(single, row, key)


class DAPORewardManager(RewardManager):
    """The "dapo" reward manager: the naive manager's scores plus DAPO's overlong penalty.

    With ``overlong_buffer_cfg.enable``, a response of L tokens is rewarded its score plus
    ``min(−(L − (max_resp_len − len)) / len · penalty_factor, 0)``: nothing until ``len`` tokens before
    ``max_resp_len``, then a penalty growing linearly to ``−penalty_factor`` at the limit. The recorded ``score``
    stays the function's (dynamic sampling's ``acc``/``score`` metrics read it); with ``log``, each row also
    reports ``overlong_reward`` (the penalty) and ``overlong`` (whether it applied)
    (validation shows them under ``val-aux/<source>/overlong_reward/mean@n``).
    """

    def __init__(self, *args: Any, overlong_buffer_cfg: Any = None, max_resp_len: int | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.overlong, self.max_resp_len = overlong_buffer_cfg, max_resp_len

    def shape(self, score: float, length: int) -> tuple[float, dict[str, Any]]:
        buffer = self.overlong
        if buffer is None or not buffer.enable:
            return score, {}
        penalty = overlong_penalty(length, self.max_resp_len, buffer.len, buffer.penalty_factor)
        return score + penalty, ({"overlong_reward": penalty, "overlong": penalty < 0} if buffer.log else {})


def overlong_penalty(length: int, max_resp_len: int, buffer_len: int, penalty_factor: float) -> float:
    """DAPO's soft overlong penalty: min(−(length − (max_resp_len − buffer_len)) / buffer_len · factor, 0)."""
    exceed = length - (max_resp_len - buffer_len)
    return min(-exceed / buffer_len * penalty_factor, 0.0)


class GDPORewardManager(RewardManager):
    """The "gdpo" reward manager: the naive manager, with ``extra_info["experiment_name"]``
    (``trainer.experiment_name``) for the function; ``algorithm.adv_estimator=gdpo`` normalises the entries of its
    result dict that ``algorithm.gdpo_reward_keys`` names, one by one."""

    def __init__(self, *args: Any, experiment_name: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.experiment_name = experiment_name

    def _score_all(self, sources: list, solutions: list[str], truths: list, infos: list[dict]) -> list[Scored]:
        infos = [{**info, "experiment_name": self.experiment_name} for info in infos]
        return super()._score_all(sources, solutions, truths, infos)


def score_of(result: Any) -> float | None:
    """The score a reward function's ``result`` holds (a real number, or a dict with one under "score"), else None."""
    score = result.get("score") if isinstance(result, dict) else result
    if isinstance(score, torch.Tensor) and score.numel() == 1:
        score = score.item()
    return float(score) if isinstance(score, numbers.Real) else None


def raised(name: str, exc: BaseException) -> Failure:
    """The failure of function ``name`` that raised ``exc`` (the line names the function: the traceback would
    point into user code)."""
    return "raised", f"reward function {name!r} raised {type(exc).__name__}: {exc}"


def failed(name: str, exc: Exception) -> Failure:
    """The failure of function ``name`` that raised ``exc``: a call of the pool past ``reward.timeout``
    (``TimeoutError``) is a timeout, one that raised in its worker is the function's exception."""
    if isinstance(exc, TimeoutError):
        return "timeout", f"reward function {name!r} timed out ({exc}; reward.timeout)"
    if isinstance(exc, CallRaised):
        return "raised", f"reward function {name!r} raised {exc}"
    return raised(name, exc)


def checked(result: Any, name: str) -> Scored:
    """A function's result as a dict with ``score`` and its extras, or a 0 score and the failure."""
    score = score_of(result)
    if score is None or not math.isfinite(score):
        return {"score": 0.0}, ("invalid", f"reward function {name!r} returned {result!r:.80}; {VALID_RESULT}")
    extras = {k: v for k, v in result.items() if k != "score"} if isinstance(result, dict) else {}
    return {"score": score, **extras}, None


def load_custom_compute_score(path: str, name: str = "compute_score") -> ComputeScore:
    """Function ``name`` of the python file at ``path`` (``reward.custom_reward_function.path/name``), imported here
    once to check it; a sync function is returned as a ``UserFunction``: each call runs in a killable worker process
    within a deadline (``data.reward_pool``; ``bounded`` sets it); an async one as it is (awaited with a timeout)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"custom reward file not found: {path!r} (looking for function {name!r})")
    module = import_file(path)
    function = getattr(module, name, None)
    if not callable(function):
        found = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise AttributeError(f"custom reward file {path!r} has no function {name!r}; callables in it: {found}")
    return function if inspect.iscoroutinefunction(function) else UserFunction(path, name)


def import_file(path: str) -> Any:
    """The module that the Python file at ``path`` defines, freshly executed (a user's reward file)."""
    spec = importlib.util.spec_from_file_location(f"colorl_user_{abs(hash(os.path.abspath(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
